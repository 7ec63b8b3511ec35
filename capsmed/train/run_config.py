"""A run's ``config.yaml`` (read and checked, and the dataset digest it records) and
its ``metrics.jsonl`` (one record per finished epoch), as training reads them back.

``capsmed train`` records the content digest of its dataset file
(:func:`capsmed.data.digest.file_digest`, the one digest every command uses) in the
``dataset`` section; ``--resume`` and ``capsmed evaluate RUN_DIR`` compare it with
the file as it is now, so a dataset edited in place is never silently taken for the
one the run was trained on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from capsmed.data.digest import file_digest
from capsmed.errors import CapsmedError, first_line, shell_quoted
from capsmed.yamlfile import read_yaml

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"  # written when training finishes
WEIGHTS, META = "checkpoint.safetensors", "checkpoint.json"  # capsmed.train.checkpoint
RESUME_FILE = "resume.pt"  # capsmed.train.state
SECTIONS = ("train", "model_kwargs", "dataset")


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved options (``train``), model arguments and dataset summary.

    Raises:
        CapsmedError: when the folder holds no ``config.yaml``, or one that is not
            YAML or lacks the sections ``capsmed train`` writes.
    """
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise CapsmedError(f"{run_dir}: not a run directory (no {CONFIG})")
    try:
        values = read_yaml(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CapsmedError(f"{path}: cannot read the run's options ({first_line(exc)})"
                           ) from None
    broken = [k for k in SECTIONS if not isinstance(values, dict)
              or not isinstance(values.get(k), dict)]
    if broken:
        raise CapsmedError(f"{path}: not a run's options: section(s) {', '.join(broken)} "
                           "missing or not a mapping")
    return values


def check_dataset_unchanged(config: dict[str, Any], run_dir: Path, data: Path) -> None:
    """Refuse ``data`` if its content differs from the digest the run recorded.

    Runs written before digests were recorded are not checked here.
    """
    saved = config["dataset"].get("digest")
    if saved is None:
        return
    now = file_digest(Path(data))
    recorded = (config.get("train") or {}).get("data")
    if now != saved and recorded and Path(recorded).resolve() != Path(data).resolve():
        raise CapsmedError(f"{data}: not the data {run_dir} was trained on ({recorded}, "
                           f"content digest {_short(saved)}; this file's is {_short(now)})")
    if now != saved:
        raise CapsmedError(f"{data}: the dataset file changed since {run_dir} was trained "
                           f"(content digest {_short(saved)}, now {_short(now)}); restore "
                           "it, or train a new run on it")


@dataclass(frozen=True)
class Unfinished:
    """Why a run's training has not finished, in words (``reason``), and whether
    ``capsmed train --resume`` can finish it (``resumable``: its state is there)."""

    run_dir: Path
    reason: str
    resumable: bool

    def then(self, command: str) -> str:
        """What to do before ``command`` ("evaluate", "predict") again gives the
        finished run's result."""
        if self.resumable:
            return f"after capsmed train --resume {shell_quoted(self.run_dir)}, {command} again"
        return f"it cannot be resumed: train it again, then {command} again"


def training_unfinished(run_dir: Path) -> Unfinished | None:
    """Why the run in ``run_dir`` has not finished training; None when it has. The one
    rule every command asks: a run is finished when ``summary.json`` is there (training
    writes it at its end, before removing ``resume.pt``) and ``resume.pt`` is not (a run
    killed between the two: ``--resume`` finishes it). A run stopped at an
    intermediate epoch whose ``resume.pt`` was then deleted (it is large) has neither:
    its checkpoint is still of that epoch."""
    run_dir = Path(run_dir)
    if (run_dir / RESUME_FILE).is_file():
        return Unfinished(run_dir, f"{RESUME_FILE} is there", resumable=True)
    if (run_dir / SUMMARY).is_file():
        return None
    if (run_dir / CONFIG).is_file():
        reason = f"no {SUMMARY}, and its resumable state was removed"
    else:  # a checkpoint copied on its own: nothing says the training finished
        reason = f"no {SUMMARY}, which training writes when it finishes"
    return Unfinished(run_dir, reason, resumable=False)


def _short(digest: str) -> str:
    kind, _, hexdigest = str(digest).partition(":")
    return f"{kind}:{hexdigest[:12]}"


def metric_records(lines: list[str]) -> list[dict[str, Any]]:
    """The epoch records of ``metrics.jsonl`` lines; a partial line (a full disk, a
    killed writer) or a line of another shape is skipped."""
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("epoch"), int):
            records.append(record)
    return records
