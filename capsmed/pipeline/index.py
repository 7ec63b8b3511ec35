"""The study index: one file holding what each evaluated run of a study scored, so the
study report reads one file instead of thousands of YAML and JSON files.

``OUT/.capsmed-run/index.jsonl`` holds one line per (run folder, evaluation): the
:class:`~capsmed.evaluate.aggregate.EvaluatedRun` that
:func:`~capsmed.evaluate.aggregate.load_evaluated_run` reads from the run's
``config.yaml`` and ``<evaluation>/report.json``, with the size and modification time
of both and of ``checkpoint.json``, and whether the report is stale (it scored an
older checkpoint than the run keeps: :attr:`capsmed.runs.index.RunSummary.report_stale`,
the check ``capsmed report`` makes). A line whose files changed since is read again
from them; a file the index cannot trust (a cut line, another version's) costs only a
reread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from capsmed.evaluate.aggregate import EvaluatedRun, load_evaluated_run
from capsmed.train.run_config import CONFIG, META

# 2: data_revision and data_digest are context, not metrics (entries of 1 held them
# as metrics)
VERSION = 2


def _signature(run_dir: Path, evaluation: str) -> list[int] | None:
    try:
        files = [(run_dir / CONFIG).stat(), (run_dir / evaluation / "report.json").stat(),
                 (run_dir / META).stat()]
    except OSError:
        return None
    return [n for st in files for n in (st.st_size, st.st_mtime_ns)]


def _stale(run_dir: Path, evaluation: str) -> str | None:
    """``capsmed report``'s refusal of a report older than the kept checkpoint."""
    if evaluation != "report":
        return None
    from capsmed.runs.index import summarise_run

    return summarise_run(run_dir).stale_reason


def _to_json(run: EvaluatedRun) -> dict[str, Any]:
    out = {f.name: getattr(run, f.name) for f in dataclasses.fields(run)}
    out["path"], out["confusion"] = str(run.path), run.confusion.tolist()
    out["class_names"] = list(run.class_names)
    return out


def _from_json(values: dict[str, Any]) -> EvaluatedRun:
    return EvaluatedRun(**{**values, "path": Path(values["path"]),
                           "class_names": tuple(values["class_names"]),
                           "confusion": np.asarray(values["confusion"], dtype=np.int64)})


class StudyIndex:
    """The index of one study's evaluated runs (read once, appended as runs appear)."""

    def __init__(self, records: Path) -> None:
        self.path = Path(records) / "index.jsonl"
        self._entries: dict[str, tuple[list[int], dict[str, Any], str | None]] | None = None
        self._new: list[str] = []

    def _load(self) -> dict[str, tuple[list[int], dict[str, Any], str | None]]:
        if self._entries is None:
            self._entries = {}
            with contextlib.suppress(OSError):
                for line in self.path.read_text(encoding="utf-8").splitlines():
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        entry = json.loads(line)
                        if entry["version"] == VERSION:
                            self._entries[entry["key"]] = (entry["stat"], entry["run"],
                                                           entry.get("stale"))
        return self._entries

    def evaluated(self, run_dir: Path, evaluation: str = "report") -> EvaluatedRun:
        """The run as its files say now: from the index when they have not changed."""
        key, stat = f"{run_dir}|{evaluation}", _signature(Path(run_dir), evaluation)
        known = self._load().get(key)
        if known is not None and stat is not None and known[0] == stat:
            with contextlib.suppress(TypeError, KeyError, ValueError):
                return _from_json(known[1])
        # through JSON either way, so an indexed run and a fresh one compare alike
        values = json.loads(json.dumps(_to_json(load_evaluated_run(run_dir, evaluation)),
                                       default=str))
        if stat is not None:
            stale = _stale(Path(run_dir), evaluation)
            self._load()[key] = (stat, values, stale)
            self._new.append(json.dumps({"version": VERSION, "key": key, "stat": stat,
                                         "run": values, "stale": stale}))
        return _from_json(values)

    def stale(self, run_dir: Path) -> str | None:
        """Why ``run_dir``'s report is older than its checkpoint, if it is (after
        :meth:`evaluated` of its ``report``)."""
        known = self._load().get(f"{run_dir}|report")
        return known[2] if known is not None else None

    def save(self) -> None:
        """Append what was read since (a read-only folder: kept in memory only)."""
        if not self._new:
            return
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write("\n".join(self._new) + "\n")
            self._new = []
