"""The progress bars of a run (epochs, and the steps of the current epoch) and its
one log line per epoch."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from rich.progress import TextColumn

from capsmed.progress import make_progress
from capsmed.train.handlers.base import LoopHandler, LoopState

if TYPE_CHECKING:
    from capsmed.train.run import Run

log = logging.getLogger(__name__)


class ProgressDisplay(LoopHandler):
    """Bars on rank 0 (unless switched off), the epoch's summary logged on every rank."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self._stack = contextlib.ExitStack()
        self.bars = make_progress(TextColumn("{task.fields[status]}"),
                                  disable=run.disable_progress)
        self.epochs_task: Any = None
        self.steps_task: Any = None

    @classmethod
    def create(cls, run: Run) -> ProgressDisplay:
        return cls(run)

    def on_start(self, loop: LoopState) -> None:
        cfg = self.run.cfg
        self._stack.enter_context(self.bars)
        self.epochs_task = self.bars.add_task(f"{cfg.arch} epochs", total=cfg.epochs,
                                              completed=loop.progress.epoch - 1, status="")

    def on_epoch_start(self, loop: LoopState) -> None:
        p = loop.progress
        self.steps_task = self.bars.add_task(f"epoch {p.epoch}", total=len(self.run.sampler),
                                             completed=p.step, status="")

    def on_step(self, loop: LoopState) -> None:
        self.bars.advance(self.steps_task)

    def on_epoch_end(self, loop: LoopState) -> None:
        record = loop.record
        self.bars.remove_task(self.steps_task)
        summary = epoch_summary(record)
        self.bars.update(self.epochs_task, advance=1, status=summary)
        log.info("epoch %d/%d: %s", record["epoch"], self.run.cfg.epochs, summary)

    def close(self) -> None:
        self._stack.close()


def epoch_summary(record: dict[str, Any]) -> str:
    """One epoch's figures in a line: training, validation, routing entropy."""
    return (f"loss {record['train_loss']:.4f} acc {record['train_acc']:.3f} "
            f"({record['images_per_s']:,.0f} img/s)"
            + (f" | val loss {record['val_loss']:.4f} acc {record['val_acc']:.3f}"
               if "val_loss" in record else "")
            + (f" | routing H {record['routing_entropy']:.3f}" if "routing_entropy" in record
               else ""))
