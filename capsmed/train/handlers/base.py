"""What a training-loop handler is, and what it sees of the loop.

The loop (:class:`capsmed.train.loop.TrainingLoop`) is the algorithm: batches, steps,
validation, the choice of the kept epoch. Everything else (files, displays, early
stopping, stopping on a signal, the resumable state) is a :class:`LoopHandler`
told about the loop's events, in the order of :data:`capsmed.train.handlers.HANDLERS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from capsmed.train.config import TrainConfig
    from capsmed.train.run import Run
    from capsmed.train.state import Progress


class LoopState(Protocol):
    """What a handler reads of the loop, and the two things it may set.

    Attributes:
        run: The run being trained (options, model, folder, data).
        progress: The loop's counters; between epochs, those of the next epoch.
            A handler may set ``progress.stopped_early`` (at ``on_epoch_end``).
        record: The last finished epoch's metrics (``metrics.jsonl``'s line).
        stop_reason: Set it (e.g. ``"SIGTERM"``) to stop resumably at the next step
            boundary; the loop then calls ``on_stop`` and raises
            :class:`~capsmed.train.loop.TrainingInterrupted`.
        steps_this_call: Steps trained by this process (a resumed run counts from 0).
        stop_after_steps: Stop after this many steps of this process (tests, scripts).
    """

    run: Run
    progress: Progress
    record: dict[str, Any]
    stop_reason: str
    steps_this_call: int
    stop_after_steps: int | None

    @property
    def finished(self) -> bool:
        """Whether training is over: the last epoch done, or stopped early."""

    def resume_point(self) -> tuple[Progress, torch.Tensor]:
        """The counters and the sampler's state that continue the run exactly from here
        (inside an epoch: a device sync for its partial sums)."""


class LoopHandler(Protocol):
    """Something the loop tells about its events. Subclass it and write the events you
    need; the others do nothing. Events, in the order they come:

    * ``on_start``: before this process's first step (a resumed run: its next step).
    * ``on_epoch_start``: the epoch's batches are drawn.
    * ``on_step``: after every step. Host work only: no device sync (``.item()``,
      ``.tolist()``, ``.cpu()``), which would make every step wait for the GPU.
    * ``on_check``: every :data:`~capsmed.train.loop.CHECK_EVERY` steps and at each
      epoch's last step, once the loss was checked finite. It may sync; under torchrun
      every rank gets it at the same step, so collectives are allowed.
    * ``on_epoch_end``: ``loop.record`` holds the epoch's metrics and
      ``loop.progress`` the next epoch's counters.
    * ``on_stop``: the run stops on request before its end; the loop raises next.
    * ``on_end``: training is over (the last epoch, or an early stop).
    * ``close``: always, last, however the loop ended (files, signal handlers).
    """

    @classmethod
    def create(cls, run: Run) -> LoopHandler | None:
        """This handler for ``run``, or None where the run's options or this process's
        rank want none (e.g. files are written by rank 0 only)."""
        raise NotImplementedError(f"{cls.__name__} must define create()")

    @staticmethod
    def check(cfg: TrainConfig) -> None:
        """Refuse, before anything is written, what this handler cannot do (a missing
        package)."""

    def on_start(self, loop: LoopState) -> None:
        """Training starts or resumes."""

    def on_epoch_start(self, loop: LoopState) -> None:
        """An epoch's batches are drawn."""

    def on_step(self, loop: LoopState) -> None:
        """A step is done (host only: no device sync)."""

    def on_check(self, loop: LoopState) -> None:
        """A check point: the loss so far is finite (may sync)."""

    def on_epoch_end(self, loop: LoopState) -> None:
        """An epoch is done and validated."""

    def on_stop(self, loop: LoopState) -> None:
        """The run stops on request before its end."""

    def on_end(self, loop: LoopState) -> None:
        """Training is over."""

    def close(self) -> None:
        """Release what the handler holds; called however the loop ended."""
