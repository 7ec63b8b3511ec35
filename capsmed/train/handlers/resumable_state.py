"""``resume.pt``, the state ``capsmed train --resume`` continues from."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capsmed.train.handlers.base import LoopHandler, LoopState
from capsmed.train.state import RESUME_FILE

if TYPE_CHECKING:
    from capsmed.train.run import Run


class ResumableState(LoopHandler):
    """Writes the state at every epoch end and when the run is stopped, and removes it
    once the run is finished (after the summary: a failure before leaves a run that
    ``--resume`` finishes). Rank 0 only; the state at the run's start is written with
    its folder (``Run._create_folder``)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.saved_step: int | None = None  # the global step of the last state written

    @classmethod
    def create(cls, run: Run) -> ResumableState | None:
        return cls(run) if run.ctx.is_main else None

    def on_epoch_end(self, loop: LoopState) -> None:
        if not loop.progress.stopped_early:  # an early stop is finished right after
            self._save(loop)

    def on_stop(self, loop: LoopState) -> None:
        if self.saved_step != loop.progress.global_step:
            self._save(loop)

    def on_end(self, loop: LoopState) -> None:
        (self.run.run_dir / RESUME_FILE).unlink(missing_ok=True)  # nothing to resume

    def _save(self, loop: LoopState) -> None:
        progress, sampler_state = loop.resume_point()
        self.run.save_state(progress, sampler_state)
        self.saved_step = progress.global_step
