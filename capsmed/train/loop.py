"""The epoch loop: steps without host-device syncs, validation, the checkpoint at minimum
validation loss, early stopping, resumable state, and a clean stop on Ctrl-C or NaN.

Syncs happen only every :data:`CHECK_EVERY` steps (to look for a non-finite loss or a
stop request, agreed across ranks under DDP) and at epoch ends.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from rich.progress import TextColumn

from capsmed.data.loader import sequential_batches
from capsmed.errors import CapsmedError, Interrupted, first_line
from capsmed.io import WriteError, append_line, write_text_atomic, writing
from capsmed.progress import make_progress
from capsmed.train.checkpoint import save_checkpoint
from capsmed.train.curves import plot_training_curves
from capsmed.train.run import Run
from capsmed.train.run_config import METRICS, SUMMARY, metric_records
from capsmed.train.state import RESUME_FILE, Progress, StopRequest, restore_rng
from capsmed.train.step import coupling_entropy, forward, loss_and_correct

log = logging.getLogger(__name__)

CHECK_EVERY = 50  # steps between looks at the NaN flag and stop requests


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


def _start(run: Run, state: dict[str, Any] | None) -> Progress:
    if state is None:
        return Progress()
    try:
        run.model.load_state_dict(state["model"])
        run.optimizer.load_state_dict(state["optimizer"])
        run.schedule.load_state_dict(state["schedule"])
        run.step.scaler.load_state_dict(state["scaler"])
        run.sampler.generator.set_state(state["sampler"])
        restore_rng(state, run.settings.augment_rng)
        progress = Progress(**state["progress"])
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise CapsmedError(f"{run.run_dir / RESUME_FILE}: does not fit this run's model "
                           f"and options ({first_line(exc)})") from None
    _truncate_metrics(run.run_dir / METRICS, progress.epoch)
    return progress


def _truncate_metrics(path: Path, epoch: int) -> None:
    """Keep the lines of finished epochs (a crash may have left the next one's, or part
    of a line when the disk filled up)."""
    if not path.is_file():
        return
    records = [r for r in metric_records(path.read_text(encoding="utf-8").splitlines())
               if r["epoch"] < epoch]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))


def _save(run: Run, progress: Progress, sampler_state: torch.Tensor) -> None:
    if run.ctx.is_main:
        run.save_state(progress, sampler_state)


def run_loop(run: Run, state: dict[str, Any] | None, stop_after_steps: int | None) -> Path:
    """Train from the start or from ``state`` until the last epoch or an early stop.

    Raises:
        TrainingInterrupted: stopped on request (Ctrl-C, SIGTERM, ``stop_after_steps``)
            after saving the state, or at once by a second Ctrl-C; exit code 130.
    """
    saved = "continue from the last saved state with: capsmed train --resume"
    try:
        return _train_epochs(run, state, stop_after_steps)
    except KeyboardInterrupt:  # the second Ctrl-C: no save, the last saved state stays
        raise TrainingInterrupted(f"{run.run_dir}: interrupted at once; {saved} "
                                  f"{run.run_dir}") from None
    except WriteError as exc:  # a full disk: every file is written atomically, so the
        # last saved state and checkpoint are whole
        raise WriteError(exc.path, exc.reason, f"once there is room, {saved} "
                         f"{run.run_dir}") from None


def _train_epochs(run: Run, state: dict[str, Any] | None, stop_after_steps: int | None
                  ) -> Path:
    cfg, ctx, device = run.cfg, run.ctx, run.device
    p = _start(run, state)
    steps_this_call = 0
    stopped_early = False
    tensorboard = _tensorboard(run)
    status = TextColumn("{task.fields[status]}")
    metrics_path = run.run_dir / METRICS
    with contextlib.ExitStack() as stack:
        stop = stack.enter_context(StopRequest(stop_after_steps))
        bars = stack.enter_context(make_progress(status, disable=run.disable_progress))
        epochs_task = bars.add_task(f"{cfg.arch} epochs", total=cfg.epochs,
                                    completed=p.epoch - 1, status="")
        while p.epoch <= cfg.epochs:
            sampler_state = run.sampler.generator.get_state()
            started = time.perf_counter()
            batches = list(run.sampler)[p.step:]  # a resumed epoch skips its finished steps
            sums = torch.tensor([p.loss_sum, p.correct], device=device, dtype=torch.float64)
            bad_step = torch.full((), -1, device=device, dtype=torch.int64)
            batch_task = bars.add_task(f"epoch {p.epoch}", total=len(run.sampler),
                                       completed=p.step, status="")
            shards = run.train_data.batches(ctx.shard(b) for b in batches)
            for b, (x, y) in zip(batches, shards, strict=True):  # a global batch, its share
                loss, correct = run.step(x, y, ctx.positions(len(b)))
                sums += torch.stack([loss.double() * len(y), correct.double()])
                bad_step = torch.where((bad_step < 0) & ~torch.isfinite(loss),
                                       p.global_step + 1, bad_step)
                p.step, p.global_step, p.seen = p.step + 1, p.global_step + 1, p.seen + len(y)
                steps_this_call += 1
                bars.advance(batch_task)
                if ctx.enabled and p.step % CHECK_EVERY and p.step != len(run.sampler):
                    continue
                if p.step % CHECK_EVERY == 0 or p.step == len(run.sampler):
                    _check_finite(run, bad_step, p)
                if _stop_requested(run, stop, steps_this_call) and p.step < len(run.sampler):
                    p.loss_sum, p.correct = sums.tolist()
                    p.epoch_seconds += time.perf_counter() - started
                    _save(run, p, sampler_state)
                    raise TrainingInterrupted(
                        f"{run.run_dir}: stopped ({stop.reason}) at epoch {p.epoch}, step "
                        f"{p.step}; continue with: capsmed train --resume {run.run_dir}")
            bars.remove_task(batch_task)
            record = _finish_epoch(run, p, sums, started)
            summary = record.pop("summary")
            if ctx.is_main:
                append_line(metrics_path, json.dumps(record))
                if tensorboard is not None:
                    for key, value in record.items():
                        if isinstance(value, int | float) and key != "epoch":
                            tensorboard.add_scalar(key, value, record["epoch"])
            bars.update(epochs_task, advance=1, status=summary)
            log.info("epoch %d/%d: %s", record["epoch"], cfg.epochs, summary)
            stopped_early = (run.val_data is not None and cfg.patience is not None
                             and record["epoch"] - p.best_epoch >= cfg.patience)
            p = Progress(epoch=p.epoch + 1, best=p.best, best_epoch=p.best_epoch,
                         global_step=p.global_step)
            if stopped_early:
                log.info("early stop: validation loss has not improved for %d epochs "
                         "(best: epoch %d)", cfg.patience, p.best_epoch)
                break
            _save(run, p, run.sampler.generator.get_state())
            if _stop_requested(run, stop, steps_this_call) and p.epoch <= cfg.epochs:
                raise TrainingInterrupted(
                    f"{run.run_dir}: stopped ({stop.reason}) after epoch {p.epoch - 1}; "
                    f"continue with: capsmed train --resume {run.run_dir}")
    if tensorboard is not None:
        tensorboard.close()
    if ctx.is_main:
        _finish_run(run, p, stopped_early)
    return run.run_dir


def _stop_requested(run: Run, stop: StopRequest, steps: int) -> bool:
    requested = stop.check(steps)
    if not run.ctx.enabled:  # a host flag: no device tensor, so the step does not wait
        return requested
    flag = torch.full((1,), 1.0 if requested else 0.0, device=run.device)
    return bool(run.ctx.max(flag).item())


def _check_finite(run: Run, bad_step: torch.Tensor, p: Progress) -> None:
    bad = int(run.ctx.max(bad_step.clone()).item())
    if bad >= 0:
        raise CapsmedError(f"{run.run_dir}: the loss became NaN/inf at step {bad} (epoch "
                           f"{p.epoch}); {_kept(p)} (try a lower --lr or --precision fp32)")


def _kept(p: Progress) -> str:
    """What a run stopped by a non-finite loss leaves to evaluate, in words."""
    if p.best_epoch == 0:
        return "no checkpoint was written: no epoch ended with a finite loss"
    return f"the checkpoint of epoch {p.best_epoch} (selection loss {p.best:.4g}) is kept"


def _finish_epoch(run: Run, p: Progress, sums: torch.Tensor, started: float
                  ) -> dict[str, Any]:
    """Epoch statistics, validation, the best checkpoint; returns the metrics record."""
    ctx = run.ctx
    seen = torch.tensor([float(p.seen)], device=run.device, dtype=torch.float64)
    totals = ctx.sum(torch.cat([sums, seen])).tolist()  # waits for the device: time after
    train_seconds = p.epoch_seconds + time.perf_counter() - started
    lr = run.optimizer.param_groups[0]["lr"]
    run.schedule.step()
    train_loss = totals[0] / max(1.0, totals[2])
    record: dict[str, Any] = {"epoch": p.epoch, "train_loss": train_loss,
                              "train_acc": totals[1] / max(1.0, totals[2]), "lr": lr,
                              "images_per_s": round(totals[2] / train_seconds, 1)}
    if run.val_data is not None:
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
        if ctx.is_main:
            save_checkpoint(run.run_dir, run.model,
                            run.checkpoint_meta(p.epoch, record.get("val_loss")))
    record["summary"] = (
        f"loss {train_loss:.4f} acc {record['train_acc']:.3f} "
        f"({record['images_per_s']:,.0f} img/s)"
        + (f" | val loss {record['val_loss']:.4f} acc {record['val_acc']:.3f}"
           if "val_loss" in record else "")
        + (f" | routing H {record['routing_entropy']:.3f}" if "routing_entropy" in record
           else ""))
    return record


def _finish_run(run: Run, p: Progress, stopped_early: bool) -> None:
    """Curves, then ``summary.json``, then no ``resume.pt``: a failure before the end
    leaves a run that ``--resume`` finishes."""
    epochs_run = p.epoch - 1
    lines = (run.run_dir / METRICS).read_text(encoding="utf-8").splitlines()
    with writing(run.run_dir / "curves.png"):
        plot_training_curves(metric_records(lines), run.run_dir / "curves.png")
    write_text_atomic(run.run_dir / SUMMARY, json.dumps({
        "best_epoch": p.best_epoch, "best_selection_loss": p.best, "epochs_run": epochs_run,
        "stopped_early": stopped_early, "train_samples": len(run.train_data),
        "train_samples_full": run.rows.full_train_size,
        "steps_per_epoch": len(run.sampler), "world_size": run.ctx.world}, indent=2))
    (run.run_dir / RESUME_FILE).unlink(missing_ok=True)  # finished: nothing to resume


def _tensorboard(run: Run) -> Any:
    if not (run.cfg.tensorboard and run.ctx.is_main):
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(run.run_dir / "tensorboard"))


