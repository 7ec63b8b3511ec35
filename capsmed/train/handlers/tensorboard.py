"""TensorBoard event files in ``RUN_DIR/tensorboard`` (``--tensorboard``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from capsmed.errors import CapsmedError
from capsmed.train.handlers.base import LoopHandler, LoopState

if TYPE_CHECKING:
    from capsmed.train.config import TrainConfig
    from capsmed.train.run import Run


class TensorBoard(LoopHandler):
    """Every number of each epoch's record as a scalar at that epoch. Rank 0 only."""

    def __init__(self, run: Run) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer: Any = SummaryWriter(log_dir=str(run.run_dir / "tensorboard"))

    @classmethod
    def create(cls, run: Run) -> TensorBoard | None:
        return cls(run) if run.cfg.tensorboard and run.ctx.is_main else None

    @staticmethod
    def check(cfg: TrainConfig) -> None:
        if not cfg.tensorboard:
            return
        try:
            importlib.import_module("torch.utils.tensorboard")
        except ImportError:
            raise CapsmedError("--tensorboard needs the tensorboard package: pip install "
                               "'capsmed[tensorboard]'") from None

    def on_epoch_end(self, loop: LoopState) -> None:
        record = loop.record
        for key, value in record.items():
            if isinstance(value, int | float) and key != "epoch":
                self.writer.add_scalar(key, value, record["epoch"])

    def close(self) -> None:
        self.writer.close()
