"""Early stopping (paper 000): stop when the validation loss has not improved for
``patience`` epochs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from capsmed.train.handlers.base import LoopHandler, LoopState

if TYPE_CHECKING:
    from capsmed.train.run import Run

log = logging.getLogger(__name__)


class EarlyStopping(LoopHandler):
    """Sets ``progress.stopped_early`` once the kept (best) epoch is ``patience`` epochs
    old, with epochs left to train (after the last one, the run ends as planned and
    ``summary.json`` says it did not stop early). Every rank decides alike: the epoch's
    losses are summed over ranks. Runs without validation data (cross-validation folds)
    never stop early."""

    def __init__(self, patience: int, epochs: int) -> None:
        self.patience, self.epochs = patience, epochs

    @classmethod
    def create(cls, run: Run) -> EarlyStopping | None:
        if run.val_data is None or run.cfg.patience is None:
            return None
        return cls(run.cfg.patience, run.cfg.epochs)

    def on_epoch_end(self, loop: LoopState) -> None:
        p, epoch = loop.progress, loop.record["epoch"]
        if epoch < self.epochs and epoch - p.best_epoch >= self.patience:
            p.stopped_early = True
            log.info("early stop: validation loss has not improved for %d epochs "
                     "(best: epoch %d)", self.patience, p.best_epoch)
