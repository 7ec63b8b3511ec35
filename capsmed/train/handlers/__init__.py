"""The training loop's handlers, in the order the loop tells them about each event.

A new handler (a tracker such as MLflow, say) is one file in this folder, a subclass
of :class:`~capsmed.train.handlers.base.LoopHandler` writing the events it needs, plus
one line in :data:`HANDLERS`. Its place in the tuple is its order: at an epoch's end
the checkpoint is written before the metrics line, early stopping decides before the
resumable state is written, and the summary is written before that state is removed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from capsmed.train.handlers.base import LoopHandler, LoopState
from capsmed.train.handlers.best_checkpoint import BestCheckpoint
from capsmed.train.handlers.display import ProgressDisplay
from capsmed.train.handlers.early_stopping import EarlyStopping
from capsmed.train.handlers.metrics_file import MetricsFile
from capsmed.train.handlers.mlflow_tracking import MLflowTracking
from capsmed.train.handlers.resumable_state import ResumableState
from capsmed.train.handlers.stop_signal import StopOnSignal
from capsmed.train.handlers.summary import RunSummary
from capsmed.train.handlers.tensorboard import TensorBoard
from capsmed.train.handlers.wandb_tracking import WandbTracking

if TYPE_CHECKING:
    from capsmed.train.config import TrainConfig
    from capsmed.train.run import Run

HANDLERS: tuple[type[LoopHandler], ...] = (
    BestCheckpoint,  # checkpoint.safetensors at the selected epochs
    MetricsFile,  # metrics.jsonl
    TensorBoard,  # --tensorboard
    ProgressDisplay,  # bars and the epoch's log line
    EarlyStopping,  # --patience
    StopOnSignal,  # Ctrl-C, SIGTERM, SIGUSR2
    RunSummary,  # curves.png, summary.json
    MLflowTracking,  # --mlflow: after the summary, whose files it logs at the end
    WandbTracking,  # --wandb: after the summary too
    ResumableState,  # resume.pt: last, once everything else of the event is written
)

__all__ = ["HANDLERS", "LoopHandler", "LoopState", "build_handlers", "check_handlers"]


def check_handlers(cfg: TrainConfig) -> None:
    """Refuse at start, before anything is written, what a handler cannot do."""
    for kind in HANDLERS:
        kind.check(cfg)


def build_handlers(run: Run) -> Iterator[LoopHandler]:
    """The handlers ``run``'s options and this process's rank call for, in order, each
    created as it is asked for (so that the caller can close those made before one
    that fails)."""
    for kind in HANDLERS:
        handler = kind.create(run)
        if handler is not None:
            yield handler
