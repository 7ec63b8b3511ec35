"""``metrics.jsonl``: one JSON line per finished epoch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from capsmed.io import append_line, write_text_atomic
from capsmed.train.handlers.base import LoopHandler, LoopState
from capsmed.train.run_config import METRICS, metric_records

if TYPE_CHECKING:
    from capsmed.train.run import Run


class MetricsFile(LoopHandler):
    """Appends each epoch's record; on resume, first drops the lines of epochs the saved
    state has not finished (a crash may have left them). Rank 0 only."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, run: Run) -> MetricsFile | None:
        return cls(run.run_dir / METRICS) if run.ctx.is_main else None

    def on_start(self, loop: LoopState) -> None:
        keep_finished_epochs(self.path, loop.progress.epoch)

    def on_epoch_end(self, loop: LoopState) -> None:
        append_line(self.path, json.dumps(loop.record))


def keep_finished_epochs(path: Path, epoch: int) -> None:
    """Keep the lines of epochs before ``epoch`` (a crash may have left the next one's,
    or part of a line when the disk filled up)."""
    if not path.is_file():
        return
    records = [r for r in metric_records(path.read_text(encoding="utf-8").splitlines())
               if r["epoch"] < epoch]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
