"""TensorBoard event files in ``RUN_DIR/tensorboard`` (``--tensorboard``).

Each epoch's numbers are scalars at that epoch, named so that TensorBoard draws what
belongs together in one section (``loss/train`` beside ``loss/val``,
``accuracy/train`` beside ``accuracy/val``). At the end, the run's options and model
arguments (:func:`~capsmed.train.handlers.run_params.run_params`) are written as
hyper-parameters with the kept and the last epoch's numbers as their metrics, so that
TensorBoard's HParams tab compares runs side by side (``tensorboard --logdir runs``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from capsmed.errors import CapsmedError
from capsmed.train.handlers.base import LoopHandler, LoopState
from capsmed.train.handlers.run_params import run_params
from capsmed.train.run_config import METRICS, metric_records

if TYPE_CHECKING:
    from capsmed.train.config import TrainConfig
    from capsmed.train.run import Run

# metrics.jsonl's names -> TensorBoard tags; the part before "/" is the section
TAGS = {"train_loss": "loss/train", "val_loss": "loss/val",
        "train_acc": "accuracy/train", "val_acc": "accuracy/val", "lr": "optimizer/lr",
        "routing_entropy": "routing/entropy", "images_per_s": "speed/images_per_s",
        "seconds": "speed/epoch_seconds", "best": "checkpoint/kept"}
# the numbers of an epoch the HParams tab shows for the kept epoch and the last one
HPARAM_METRICS = ("train_loss", "train_acc", "val_loss", "val_acc", "routing_entropy")


def scalar_tag(key: str) -> str:
    """The TensorBoard tag of a record's number (a new one: ``other/<name>``)."""
    return TAGS.get(key, f"other/{key}")


class TensorBoard(LoopHandler):
    """Every number of each epoch's record as a grouped scalar at that epoch, and the
    run's hyper-parameters at the end. Rank 0 only."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.writer: Any = None

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

    def on_start(self, loop: LoopState) -> None:
        """Open the writer. A resumed run writes its epochs again from its state's
        epoch on, and a run killed after its last saved state had written some of them
        already: ``purge_step`` hides those (metrics.jsonl drops them too), else
        TensorBoard shows both attempts' values at those epochs."""
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(self.run.run_dir / "tensorboard"),
                                    purge_step=loop.progress.epoch)

    def on_epoch_end(self, loop: LoopState) -> None:
        record = loop.record
        for key, value in record.items():
            if isinstance(value, int | float) and key != "epoch":  # a bool: 0 or 1
                self.writer.add_scalar(scalar_tag(key), value, record["epoch"])

    def on_end(self, loop: LoopState) -> None:
        """The hyper-parameters, with the kept epoch's numbers (``best/...``) and the
        last epoch's (``final/...``) as their metrics, read from ``metrics.jsonl`` (a
        resumed run's earlier epochs are there too)."""
        from torch.utils.tensorboard.summary import hparams

        lines = (self.run.run_dir / METRICS).read_text(encoding="utf-8").splitlines()
        records = metric_records(lines)
        kept = next(r for r in records if r["epoch"] == loop.progress.best_epoch)
        metrics: dict[str, float] = {"best/epoch": kept["epoch"]}
        for prefix, record in (("best", kept), ("final", records[-1])):
            metrics.update({f"{prefix}/{k}": record[k] for k in HPARAM_METRICS
                            if k in record})
        for summary in hparams(run_params(self.run), metrics):
            self.writer.file_writer.add_summary(summary)
        step = records[-1]["epoch"]
        for tag, value in metrics.items():  # the values the HParams tab shows
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
