"""``resume.pt``, the state ``capsmed train --resume`` continues from."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from capsmed.train.checkpoint import drop_kept, keep_for_resume
from capsmed.train.handlers.base import LoopHandler, LoopState
from capsmed.train.state import RESUME_FILE

if TYPE_CHECKING:
    from capsmed.train.run import Run


class ResumableState(LoopHandler):
    """Writes the state at most every ``state_every_minutes`` (at the first check point
    or epoch end after that time), at the end of training (before the summary: a
    failure there leaves a run that ``--resume`` finishes without training again) and
    when the run is stopped; removes it once the run is finished. Rank 0 only.

    A full state is large (the paper CapsNet's 83 MiB, the Baseline's 406 MiB) and
    takes seconds to write; at every epoch end it cost as much as the training of a
    short epoch on a GPU. Written at a check point inside an epoch it is as exact as
    at an epoch end (the epoch's batches are drawn again from the sampler's state at
    its start and the finished ones skipped). The checkpoint of the state's kept epoch
    is kept beside it (hard links), for ``--resume`` to put back
    (:func:`~capsmed.train.checkpoint.keep_for_resume`). The state at the run's start is written
    with its folder (``Run._create_folder``), so a run killed before the first write
    here resumes from its start.
    """

    def __init__(self, run: Run) -> None:
        self.run = run
        self.every_s = 60.0 * run.cfg.state_every_minutes
        self.last_write = time.monotonic()
        self.saved_step: int | None = None  # the global step of the last state written

    @classmethod
    def create(cls, run: Run) -> ResumableState | None:
        return cls(run) if run.ctx.is_main else None

    def on_start(self, loop: LoopState) -> None:
        self.last_write = time.monotonic()  # the state just written or read

    def on_check(self, loop: LoopState) -> None:
        last_step = loop.progress.step == len(self.run.sampler)  # the epoch end is next
        if self._due() and not last_step:
            self._save(loop)

    def on_epoch_end(self, loop: LoopState) -> None:
        if self._due() or loop.finished or loop.stop_reason:
            self._save(loop)

    def on_stop(self, loop: LoopState) -> None:
        if self.saved_step != loop.progress.global_step:
            self._save(loop)

    def on_end(self, loop: LoopState) -> None:
        (self.run.run_dir / RESUME_FILE).unlink(missing_ok=True)  # nothing to resume
        drop_kept(self.run.run_dir)

    def _due(self) -> bool:
        return time.monotonic() - self.last_write >= self.every_s

    def _save(self, loop: LoopState) -> None:
        progress, sampler_state = loop.resume_point()
        self.run.save_state(progress, sampler_state)
        keep_for_resume(self.run.run_dir)  # the checkpoint that goes with it
        self.saved_step, self.last_write = progress.global_step, time.monotonic()
