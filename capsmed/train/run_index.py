"""Find and summarise run directories (for ``capsmed runs ls``)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import yaml

from capsmed.train.protocol import protocol_label, protocol_settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSummary:
    """What a run directory says about itself."""

    path: Path
    arch: str
    dataset: str
    protocol: str
    epochs_run: int
    best_epoch: int | None
    val_loss: float | None
    val_acc: float | None
    evaluated: bool


def _protocol(train: dict) -> str:
    """The run's protocol (:mod:`capsmed.train.protocol`) and, for CV, its fold."""
    label = protocol_label(protocol_settings(train))
    return label + (f", fold {train['fold']}" if train.get("fold") is not None else "")


def summarise_run(run_dir: Path) -> RunSummary:
    """Read a run's config, metrics and checkpoint metadata (raises on a broken run)."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    metrics = [json.loads(line) for line in lines if line.strip()]
    meta_path = run_dir / "checkpoint.json"
    best = json.loads(meta_path.read_text(encoding="utf-8"))["epoch"] if meta_path.is_file() \
        else None
    at_best = next((m for m in metrics if m["epoch"] == best), {})
    return RunSummary(path=run_dir, arch=config["train"]["arch"],
                      dataset=config["dataset"]["name"], protocol=_protocol(config["train"]),
                      epochs_run=len(metrics), best_epoch=best,
                      val_loss=at_best.get("val_loss"), val_acc=at_best.get("val_acc"),
                      evaluated=(run_dir / "report" / "report.json").is_file())


def find_runs(root: Path) -> list[RunSummary]:
    """Every run directory below ``root`` (a folder with ``config.yaml``), sorted by path.

    Folders that look like runs but cannot be read are skipped with a warning.
    """
    runs = []
    for config in sorted(Path(root).rglob("config.yaml")):
        try:
            runs.append(summarise_run(config.parent))
        except (OSError, KeyError, ValueError, yaml.YAMLError) as exc:
            log.warning("%s: skipped, not a readable run (%s)", config.parent, exc)
    return runs
