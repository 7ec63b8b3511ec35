"""The checkpoint at minimum validation loss (``checkpoint.safetensors`` + ``.json``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capsmed.train.checkpoint import restore_for_resume, save_checkpoint
from capsmed.train.handlers.base import LoopHandler, LoopState

if TYPE_CHECKING:
    from capsmed.train.run import Run


class BestCheckpoint(LoopHandler):
    """Writes the weights of every epoch the loop selects (``record["best"]``: a lower
    validation loss, or every epoch of a run without validation). Rank 0 only."""

    def __init__(self, run: Run) -> None:
        self.run = run

    @classmethod
    def create(cls, run: Run) -> BestCheckpoint | None:
        return cls(run) if run.ctx.is_main else None

    def on_start(self, loop: LoopState) -> None:
        """On ``--resume``, the checkpoint of the state's kept epoch, not one a crashed
        attempt wrote after the state."""
        restore_for_resume(self.run.run_dir, loop.progress.best_epoch)

    def on_epoch_end(self, loop: LoopState) -> None:
        record = loop.record
        if record["best"]:
            save_checkpoint(self.run.run_dir, self.run.model,
                            self.run.checkpoint_meta(record["epoch"], record.get("val_loss")))
