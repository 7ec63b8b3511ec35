"""The epoch loop, as the algorithm: draw the epoch's batches, step through them,
validate, select the epoch to keep; then the next epoch, until the last one or a stop.

Everything around the algorithm hangs on its events (:mod:`capsmed.train.handlers`):
the checkpoint, ``metrics.jsonl``, TensorBoard, the progress bars, early stopping,
stopping on Ctrl-C or a signal, and the resumable state. The steps never wait for
the device: their loss sums and a non-finite flag accumulate there
(:class:`~capsmed.train.step.EpochTally`), and are read only every
:data:`CHECK_EVERY` steps and at epoch ends. A non-finite loss stops the run: it is
the algorithm's own guard, not an optional handler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any, NoReturn

import torch

from capsmed.data.loader import sequential_batches
from capsmed.errors import CapsmedError, Interrupted, first_line, shell_quoted
from capsmed.io import WriteError
from capsmed.train.handlers import LoopHandler, build_handlers
from capsmed.train.run import Run
from capsmed.train.state import RESUME_FILE, Progress, restore_rng
from capsmed.train.step import coupling_entropy, float32_matmuls, forward, loss_and_correct

log = logging.getLogger(__name__)

CHECK_EVERY = 50  # steps between looks at the non-finite flag (and the handlers' on_check)


class TrainingInterrupted(Interrupted):
    """A run stopped on request; its state is saved and it can be resumed (exit 130)."""


@torch.no_grad()
def evaluate_loss(run: Run, data: Any) -> dict[str, float]:
    """Validation loss, accuracy and (capsule networks) mean coupling entropy."""
    model, settings, ctx = run.model, run.settings, run.ctx
    model.eval()
    entropy = model.returns_couplings
    sums = torch.zeros(5, device=run.device)  # loss*n, correct, n, entropy sum, rows
    batches = (ctx.shard(b) for b in sequential_batches(len(data), run.cfg.eval_batch_size))
    for x, y in data.batches(batches):
        if len(y) == 0:
            continue
        kwargs = {"return_couplings": True} if entropy else {}
        out = forward(model, x, y, settings, **kwargs)
        loss, correct = loss_and_correct(out, x, y, settings, weighted=False)
        # Python numbers enter as kernel arguments: no host-to-device copy, no sync.
        sums[0] += loss * len(y)
        sums[1] += correct
        sums[2] += len(y)
        if out.couplings is not None:
            sums[3:] += coupling_entropy(out.couplings)
    model.train()
    total = ctx.sum(sums).tolist()
    n = max(1.0, total[2])
    result = {"val_loss": total[0] / n, "val_acc": total[1] / n}
    if total[4] > 0:
        result["routing_entropy"] = total[3] / total[4]
    return result


def run_loop(run: Run, state: dict[str, Any] | None, stop_after_steps: int | None) -> Path:
    """Train from the start or from ``state`` until the last epoch or an early stop.

    Raises:
        TrainingInterrupted: stopped on request (Ctrl-C, SIGTERM, ``stop_after_steps``)
            after saving the state, or at once by a second Ctrl-C; exit code 130.
    """
    saved = "continue from the last saved state with: capsmed train --resume"
    try:
        with float32_matmuls(run.precision):  # fp32 is IEEE fp32 unless tf32 is asked
            return TrainingLoop(run, state, stop_after_steps).train()
    except KeyboardInterrupt:  # the second Ctrl-C: no save, the last saved state stays
        raise TrainingInterrupted(f"{run.run_dir}: interrupted at once; {saved} "
                                  f"{shell_quoted(run.run_dir)}") from None
    except WriteError as exc:  # a full disk: every file is written atomically, so the
        # last saved state and checkpoint are whole
        raise WriteError(exc.path, exc.reason, f"once there is room, {saved} "
                         f"{shell_quoted(run.run_dir)}") from None


class TrainingLoop:
    """One process's share of a run, from ``state`` (or the start) to the end or a stop.

    What handlers see of it is :class:`capsmed.train.handlers.LoopState`.
    """

    def __init__(self, run: Run, state: dict[str, Any] | None,
                 stop_after_steps: int | None) -> None:
        self.run, self.stop_after_steps = run, stop_after_steps
        self.progress = _restore(run, state)
        self.record: dict[str, Any] = {}
        self.stop_reason = ""
        self.steps_this_call = 0
        self.in_epoch = False
        self._epoch_started = 0.0
        self._sampler_state = run.sampler.generator.get_state()
        self._job_sums: tuple[int, list[float]] = (-1, [])  # see _sum_over_ranks
        self.handlers: list[LoopHandler] = []

    @property
    def finished(self) -> bool:
        return self.progress.stopped_early or self.progress.epoch > self.run.cfg.epochs

    def train(self) -> Path:
        with contextlib.ExitStack() as stack:
            for handler in build_handlers(self.run):
                stack.callback(handler.close)  # however the loop ends, in reverse order
                self.handlers.append(handler)
            self._emit("on_start")
            while not self.finished:
                self._train_epoch()
            self._emit("on_end")
        return self.run.run_dir

    def _train_epoch(self) -> None:
        run, ctx, p = self.run, self.run.ctx, self.progress
        self._sampler_state = run.sampler.generator.get_state()
        self._epoch_started = time.perf_counter()
        batches = list(run.sampler)[p.step:]  # a resumed epoch skips its finished steps
        run.tally.start_epoch(p.loss_sum, p.correct, p.global_step)
        self.in_epoch = True
        self._emit("on_epoch_start")
        shards = run.train_data.batches(ctx.shard(b) for b in batches)
        for b, (x, y) in zip(batches, shards, strict=True):  # a global batch, its share
            run.step(x, y, ctx.positions(len(b)))
            p.step, p.global_step, p.seen = p.step + 1, p.global_step + 1, p.seen + len(y)
            self.steps_this_call += 1
            self._emit("on_step")
            if p.step % CHECK_EVERY == 0 or p.step == len(run.sampler):
                self._check_finite()
                self._sum_over_ranks()
                self._emit("on_check")
            if self.stop_reason and p.step < len(run.sampler):
                self._stop(f"at epoch {p.epoch}, step {p.step}")
        self.record = _finish_epoch(run, p, self._epoch_started)
        self.in_epoch = False
        self.progress = Progress(epoch=p.epoch + 1, best=p.best, best_epoch=p.best_epoch,
                                 global_step=p.global_step)
        self._emit("on_epoch_end")
        if self.stop_reason and not self.finished:
            self._stop(f"after epoch {p.epoch}")

    def resume_point(self) -> tuple[Progress, torch.Tensor]:
        """The counters and sampler state that continue the run exactly from here.

        Inside an epoch: the sampler's state at the epoch's start (its batches are drawn
        again and the finished ones skipped) and the partial sums (a device sync);
        between epochs: the next epoch's counters and the sampler as it is.
        """
        if not self.in_epoch:
            return self.progress, self.run.sampler.generator.get_state()
        loss_sum, correct = self.run.tally.sums.tolist()
        seen = self.progress.seen
        if self.run.ctx.enabled:  # the whole job's sums (rank 0 writes the state)
            step, (loss_sum, correct, seen) = self._job_sums
            assert step == self.progress.global_step, "job sums of another step"
        spent = self.progress.epoch_seconds + time.perf_counter() - self._epoch_started
        return (dataclasses.replace(self.progress, loss_sum=loss_sum, correct=correct,
                                    seen=int(seen), epoch_seconds=spent),
                self._sampler_state)

    def _sum_over_ranks(self) -> None:
        """Under torchrun, the epoch's partial sums over every rank (a collective: every
        rank calls it at the same step), which :meth:`resume_point` saves: each rank's
        own are only its share of the batches."""
        run = self.run
        if run.ctx.enabled:
            seen = torch.tensor([float(self.progress.seen)], device=run.device,
                                dtype=torch.float64)
            sums = run.ctx.sum(torch.cat([run.tally.sums, seen])).tolist()
            self._job_sums = (self.progress.global_step, sums)

    def _emit(self, event: str) -> None:
        for handler in self.handlers:
            getattr(handler, event)(self)

    def _stop(self, where: str) -> NoReturn:
        if self.in_epoch:
            self._check_finite()  # a state past a non-finite loss is never saved
            self._sum_over_ranks()
        self._emit("on_stop")
        run_dir = self.run.run_dir
        raise TrainingInterrupted(f"{run_dir}: stopped ({self.stop_reason}) {where}; "
                                  f"continue with: capsmed train --resume {shell_quoted(run_dir)}")

    def _check_finite(self) -> None:
        run, p = self.run, self.progress
        bad = int(run.ctx.max(run.tally.bad_step.clone()).item())
        if bad >= 0:
            raise CapsmedError(f"{run.run_dir}: the loss became NaN/inf at step {bad} "
                               f"(epoch {p.epoch}); {_kept(p)} (try a lower --lr or "
                               "--precision fp32)")


def _restore(run: Run, state: dict[str, Any] | None) -> Progress:
    """Load a saved state into the run's model, optimiser, schedule, scaler and RNGs."""
    if state is None:
        return Progress()
    try:
        run.model.load_state_dict(state["model"])
        run.optimizer.load_state_dict(state["optimizer"])
        run.schedule.load_state_dict(state["schedule"])
        run.train_step.scaler.load_state_dict(state["scaler"])
        run.sampler.generator.set_state(state["sampler"])
        restore_rng(state, run.settings.augment_rng)
        progress = Progress(**state["progress"])
    except CapsmedError as exc:
        raise CapsmedError(f"{run.run_dir / RESUME_FILE}: {exc}") from None
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise CapsmedError(f"{run.run_dir / RESUME_FILE}: does not fit this run's model "
                           f"and options ({first_line(exc)})") from None
    if not run.ctx.is_main:  # a partial epoch's saved sums are the whole job's (over
        # every rank): rank 0 carries them on, the others start from 0
        progress = dataclasses.replace(progress, loss_sum=0.0, correct=0.0, seen=0)
    return progress


def _kept(p: Progress) -> str:
    """What a run stopped by a non-finite loss leaves to evaluate, in words."""
    if p.best_epoch == 0:
        return "no checkpoint was written: no epoch ended with a finite loss"
    return f"the checkpoint of epoch {p.best_epoch} (selection loss {p.best:.4g}) is kept"


def _check_finite_weights(run: Run, p: Progress) -> None:
    """Refuse weights that the epoch's last update made NaN/inf from a finite loss (a
    non-finite gradient): the next step's loss would say so, but after the run's last
    step nothing would, and without validation they would be kept as the checkpoint."""
    params = [q.detach() for q in run.model.parameters()]
    if params and not bool(torch.stack([torch.isfinite(q).all() for q in params]).all()):
        raise CapsmedError(f"{run.run_dir}: the weights became NaN/inf in the last step of "
                           f"epoch {p.epoch} (a non-finite gradient); {_kept(p)} (try a "
                           "lower --lr or --precision fp32)")


def _finish_epoch(run: Run, p: Progress, started: float) -> dict[str, Any]:
    """Epoch statistics, validation and the choice of the epoch to keep (``best``);
    returns the epoch's record."""
    ctx = run.ctx
    seen = torch.tensor([float(p.seen)], device=run.device, dtype=torch.float64)
    totals = ctx.sum(torch.cat([run.tally.sums, seen])).tolist()  # waits: time after
    train_seconds = p.epoch_seconds + time.perf_counter() - started
    _check_finite_weights(run, p)
    lr = run.optimizer.param_groups[0]["lr"]
    run.schedule.step()
    train_loss = totals[0] / max(1.0, totals[2])
    record: dict[str, Any] = {"epoch": p.epoch, "train_loss": train_loss,
                              "train_acc": totals[1] / max(1.0, totals[2]), "lr": lr,
                              "images_per_s": round(totals[2] / train_seconds, 1)}
    if run.val_data is not None:
        ctx.broadcast_buffers(run.model)  # validate the model rank 0 keeps
        record.update(evaluate_loss(run, run.val_data))
    record["seconds"] = round(time.perf_counter() - started + p.epoch_seconds, 3)
    selection = record.get("val_loss", train_loss)
    if not math.isfinite(selection):  # NaN < best is False: it would never be kept
        raise CapsmedError(f"{run.run_dir}: the {'validation' if run.val_data else 'training'}"
                           f" loss of epoch {p.epoch} is NaN/inf (the model diverged); "
                           f"{_kept(p)} (try a lower --lr or --precision fp32)")
    # with validation, the lowest validation loss is kept; without (cross-validation
    # folds, paper 001), the last epoch is, and the record says so
    record["best"] = selection < p.best or run.val_data is None
    if record["best"]:
        p.best, p.best_epoch = selection, p.epoch
    return record
