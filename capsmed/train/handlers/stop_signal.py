"""Stopping a run on request (Ctrl-C, SIGTERM, SIGUSR2), so that ``--resume`` continues it."""

from __future__ import annotations

import contextlib
import signal
from typing import TYPE_CHECKING, Any

import torch

from capsmed.train.handlers.base import LoopHandler, LoopState

if TYPE_CHECKING:
    from capsmed.train.run import Run


class StopRequest:
    """Turns Ctrl-C / SIGTERM / SIGUSR2 into a request the loop honours after the current step.

    A second Ctrl-C interrupts at once (the last saved state still resumes). Outside
    the main thread (where signals cannot be handled) it only counts ``stop_after``.
    """

    def __init__(self, stop_after_steps: int | None = None) -> None:
        self.requested = False
        self.reason = ""
        self.stop_after = stop_after_steps
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.reason = signal.Signals(signum).name

    def __enter__(self) -> StopRequest:
        # SIGUSR2: Slurm's warning before a time limit (submitit asks for it), sent to
        # every process of the job; its default action would kill the run unsaved.
        for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR2", None)):
            if sig is None:
                continue
            with contextlib.suppress(ValueError):  # not the main thread: no handlers
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def check(self, steps_done: int) -> bool:
        if self.stop_after is not None and steps_done >= self.stop_after:
            self.requested, self.reason = True, f"stop after {self.stop_after} steps"
        return self.requested


class StopOnSignal(LoopHandler):
    """Sets ``loop.stop_reason`` when a stop was requested. On one process it looks at a
    host flag after every step (no device tensor, so the step does not wait); under
    torchrun the ranks agree at check points and epoch ends (a collective), so every
    rank stops at the same step."""

    def __init__(self, run: Run) -> None:
        self.ctx, self.device = run.ctx, run.device
        self.request: StopRequest | None = None

    @classmethod
    def create(cls, run: Run) -> StopOnSignal:
        return cls(run)

    def on_start(self, loop: LoopState) -> None:
        self.request = StopRequest(loop.stop_after_steps).__enter__()

    def on_step(self, loop: LoopState) -> None:
        if not self.ctx.enabled:
            self._look(loop)

    def on_check(self, loop: LoopState) -> None:
        if self.ctx.enabled:
            self._look(loop)

    def on_epoch_end(self, loop: LoopState) -> None:
        self._look(loop)

    def _look(self, loop: LoopState) -> None:
        assert self.request is not None
        requested = self.request.check(loop.steps_this_call)
        if self.ctx.enabled:
            flag = torch.full((1,), 1.0 if requested else 0.0, device=self.device)
            requested = bool(self.ctx.max(flag).item())
        if requested:
            loop.stop_reason = self.request.reason or "requested on another rank"

    def close(self) -> None:
        if self.request is not None:
            self.request.__exit__()
