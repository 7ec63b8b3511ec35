"""What a finished run adds to its folder: ``curves.png`` and ``summary.json``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from capsmed.io import write_text_atomic, writing
from capsmed.train.curves import plot_training_curves
from capsmed.train.handlers.base import LoopHandler, LoopState
from capsmed.train.run_config import METRICS, SUMMARY, metric_records

if TYPE_CHECKING:
    from capsmed.train.run import Run


class RunSummary(LoopHandler):
    """Curves, then ``summary.json`` (which marks the run finished). Rank 0 only."""

    def __init__(self, run: Run) -> None:
        self.run = run

    @classmethod
    def create(cls, run: Run) -> RunSummary | None:
        return cls(run) if run.ctx.is_main else None

    def on_end(self, loop: LoopState) -> None:
        run, p = self.run, loop.progress
        lines = (run.run_dir / METRICS).read_text(encoding="utf-8").splitlines()
        with writing(run.run_dir / "curves.png"):
            plot_training_curves(metric_records(lines), run.run_dir / "curves.png")
        write_text_atomic(run.run_dir / SUMMARY, json.dumps({
            "best_epoch": p.best_epoch, "best_selection_loss": p.best,
            "epochs_run": p.epoch - 1, "stopped_early": p.stopped_early,
            "train_samples": len(run.train_data),
            "train_samples_full": run.rows.full_train_size,
            "steps_per_epoch": len(run.sampler), "world_size": run.ctx.world}, indent=2))
