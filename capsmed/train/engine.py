"""The training loop: data held on the device as uint8, Adam, validation every epoch,
and the checkpoint at minimum validation loss kept (paper 000's protocol).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import platform
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from rich.progress import TextColumn

from capsmed import __version__
from capsmed.data.contract import DatasetInfo, SplitData, load_split, read_info
from capsmed.data.protocols import select_training_indices
from capsmed.errors import CapsmedError
from capsmed.io import atomic_path, ensure_writable_dir, write_text_atomic
from capsmed.models import count_parameters, create_model
from capsmed.progress import make_progress
from capsmed.train.augment import augment_batch, get_recipe
from capsmed.train.checkpoint import save_checkpoint
from capsmed.train.config import TrainConfig
from capsmed.train.losses import balanced_class_weights, training_loss
from capsmed.train.optim import build_optimizer, build_schedule
from capsmed.train.sampling import BatchSampler

log = logging.getLogger(__name__)


def select_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA, then Apple MPS, then CPU; anything else is passed to torch."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise CapsmedError(f"unknown device '{name}' ({exc})") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CapsmedError(f"device '{name}' requested but CUDA is not available here")
    return device


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


class DeviceSplit:
    """A split held on the device as uint8; batches are sliced there, not copied per step."""

    def __init__(self, split: SplitData, device: torch.device) -> None:
        self.images = torch.from_numpy(split.images).to(device)
        self.labels = torch.from_numpy(split.labels).to(device)

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index].float().div_(255.0), self.labels[index]


def channel_statistics(images: np.ndarray) -> dict[str, list[float]]:
    """Per-channel mean and std of uint8 images [N, C, H, W], on the [0, 1] scale."""
    if len(images) == 0:
        raise CapsmedError("the training split is empty")
    x = images.astype(np.float64) / 255.0
    std = x.std(axis=(0, 2, 3))
    return {"input_mean": [round(float(v), 6) for v in x.mean(axis=(0, 2, 3))],
            "input_std": [round(float(max(v, 1e-3)), 6) for v in std]}


def check_free_space(run_dir: Path, model: torch.nn.Module) -> None:
    """Fail now, not after hours, if the run directory cannot hold two checkpoints.

    A checkpoint is written beside the previous one before replacing it, hence two,
    plus a margin for metrics, curves and the report.
    """
    need = 2 * sum(t.numel() * t.element_size() for t in model.state_dict().values())
    need += 32 * 2**20
    existing = next(p for p in (run_dir, *run_dir.absolute().parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free < need:
        raise CapsmedError(f"{run_dir}: only {free / 2**20:,.0f} MiB free, a run of this "
                           f"model needs about {need / 2**20:,.0f} MiB; free some space or "
                           "choose another --out")


def _default_run_dir(cfg: TrainConfig, info: DatasetInfo) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{info.dataset}-{cfg.arch}-s{cfg.seed}-{stamp}"


def _prepare_run_dir(path: Path) -> Path:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise CapsmedError(f"{path}: run directory already exists and is not empty; "
                           "choose another --out or remove it")
    ensure_writable_dir(path)
    return path


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, data: DeviceSplit, cfg: TrainConfig
                  ) -> tuple[float, float]:
    """Mean loss and accuracy over a split (same loss as training, decoder masked by truth)."""
    model.eval()
    total = torch.zeros((), device=data.labels.device)
    correct = torch.zeros((), device=data.labels.device)
    for start in range(0, len(data), cfg.eval_batch_size):
        index = torch.arange(start, min(start + cfg.eval_batch_size, len(data)),
                             device=data.labels.device)
        x, y = data.batch(index)
        out = model(x, target=y)
        total += training_loss(model.loss_kind, out, x, y, cfg.recon_weight) * len(y)
        correct += (out.scores.argmax(1) == y).sum()
    n = max(1, len(data))
    return total.item() / n, correct.item() / n


def train(config: TrainConfig, disable_progress: bool | None = None) -> Path:
    """Train ``config.arch`` on ``config.data``; return the run directory.

    The run directory holds ``config.yaml`` (resolved), ``metrics.jsonl`` (one line per
    epoch) and the checkpoint at minimum validation loss (``checkpoint.safetensors`` +
    ``checkpoint.json``), so ``capsmed evaluate RUN_DIR`` needs nothing else.
    """
    info = read_info(Path(config.data))
    cfg = config.resolved(info.dataset)
    if "train" not in info.split_sizes:
        raise CapsmedError(f"{info.path}: has no 'train' split")
    device = select_device(cfg.device)
    full_train = load_split(info.path, "train")
    # Paper 000's protocols choose indices; the run records them, the file is untouched.
    # Chosen before the run directory exists, so a bad protocol leaves nothing behind.
    chosen = select_training_indices(full_train.labels, info.class_names, cfg.protocol,
                                     cfg.seed)
    train_split = SplitData(full_train.images[chosen], full_train.labels[chosen],
                            full_train.groups[chosen])
    model_kwargs = {"in_channels": info.channels, "num_classes": info.num_classes,
                    "input_size": list(info.image_size),
                    **(channel_statistics(train_split.images) if cfg.standardize else {}),
                    **cfg.model_kwargs}
    run_path = Path(cfg.out) if cfg.out else _default_run_dir(cfg, info)
    seed_everything(cfg.seed)  # the model's initialisation is what the seed fixes
    model = create_model(cfg.arch, **model_kwargs).to(device)
    check_free_space(run_path, model)  # before anything is written
    run_dir = _prepare_run_dir(run_path)
    with atomic_path(run_dir / "train_indices.npy") as tmp, tmp.open("wb") as fh:
        np.save(fh, chosen)
    train_data = DeviceSplit(train_split, device)
    val_data = (DeviceSplit(load_split(info.path, "val"), device)
                if info.split_sizes.get("val") else None)
    if val_data is None:
        log.warning("%s has no validation split: the last epoch's weights are kept",
                    info.path)
    optimiser = build_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
    schedule = build_schedule(cfg.lr_schedule, optimiser, cfg.lr_decay)
    steps = cfg.steps_per_epoch
    if steps is None and not cfg.protocol.is_full:  # same iterations as the full split
        steps = math.ceil(len(full_train) / cfg.batch_size)
    sampler = BatchSampler(train_data.labels, cfg.batch_size, cfg.sampler, steps,
                           torch.Generator().manual_seed(cfg.seed))
    weights = (balanced_class_weights(train_data.labels, info.num_classes)
               if cfg.class_weights == "balanced" else None)
    augment = get_recipe(cfg.augment_recipe) if cfg.augment else None
    augment_rng = (torch.Generator(device=device).manual_seed(cfg.seed + 1)
                   if augment is not None else None)

    resolved = {**cfg.to_dict(), "data": str(info.path.resolve()), "out": str(run_dir)}
    environment = {"capsmed": __version__, "torch": str(torch.__version__),
                   "device": _device_name(device), "python": platform.python_version(),
                   "parameters": count_parameters(model)}
    write_text_atomic(run_dir / "config.yaml", yaml.safe_dump(
        {"train": resolved, "model_kwargs": model_kwargs, "environment": environment,
         "dataset": {"name": info.dataset, "class_names": list(info.class_names),
                     "splits": info.split_sizes}}, sort_keys=False))
    log.info("training %s (%s parameters) on %s, %d of %d train / %d val images, %d steps "
             "per epoch -> %s", cfg.arch, f"{environment['parameters']:,}",
             environment["device"], len(train_data), len(full_train),
             len(val_data) if val_data else 0, len(sampler), run_dir)

    best, best_epoch, stopped_early = math.inf, 0, False
    metrics_path = run_dir / "metrics.jsonl"
    status = TextColumn("{task.fields[status]}")
    with make_progress(status, disable=disable_progress) as progress, \
            metrics_path.open("w", encoding="utf-8") as metrics_file:
        epochs_task = progress.add_task(f"{cfg.arch} epochs", total=cfg.epochs, status="")
        for epoch in range(1, cfg.epochs + 1):
            started = time.perf_counter()
            model.train()
            loss_sum = torch.zeros((), device=device)
            correct = torch.zeros((), device=device)
            seen = 0
            batch_task = progress.add_task(f"epoch {epoch}", total=len(sampler), status="")
            for index in sampler:
                x, y = train_data.batch(index.to(device, non_blocking=True))
                if augment is not None:
                    x = augment_batch(x, augment, augment_rng)
                seen += len(y)
                out = model(x, target=y)
                loss = training_loss(model.loss_kind, out, x, y, cfg.recon_weight, weights)
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                loss_sum += loss.detach() * len(y)
                correct += (out.scores.detach().argmax(1) == y).sum()
                progress.advance(batch_task)
            progress.remove_task(batch_task)
            lr = optimiser.param_groups[0]["lr"]
            schedule.step()
            train_loss = loss_sum.item() / seen  # waits for the device: time after it
            train_seconds = time.perf_counter() - started
            if not math.isfinite(train_loss):
                raise CapsmedError(f"{run_dir}: loss became {train_loss} in epoch {epoch}; "
                                   "the last good checkpoint is kept (try a lower --lr)")
            record: dict[str, Any] = {"epoch": epoch, "train_loss": train_loss,
                                      "train_acc": correct.item() / seen, "lr": lr,
                                      "images_per_s": round(seen / train_seconds, 1)}
            if val_data is not None:
                record["val_loss"], record["val_acc"] = evaluate_loss(model, val_data, cfg)
            record["seconds"] = round(time.perf_counter() - started, 3)
            selection = record.get("val_loss", train_loss)
            record["best"] = selection < best
            if record["best"] or val_data is None:
                best, best_epoch = min(best, selection), epoch
                save_checkpoint(run_dir, model, {
                    "arch": cfg.arch, "model_kwargs": model_kwargs, "epoch": epoch,
                    "val_loss": record.get("val_loss"), "dataset": info.dataset,
                    "class_names": list(info.class_names), "data": str(info.path.resolve()),
                    "loss_kind": model.loss_kind, "format": 1})
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()
            summary = (f"loss {train_loss:.4f} acc {record['train_acc']:.3f} "
                       f"({record['images_per_s']:,.0f} img/s)"
                       + (f" | val loss {record['val_loss']:.4f} acc {record['val_acc']:.3f}"
                          if val_data is not None else ""))
            progress.update(epochs_task, advance=1, status=summary)
            log.info("epoch %d/%d: %s", epoch, cfg.epochs, summary)
            if (val_data is not None and cfg.patience is not None
                    and epoch - best_epoch >= cfg.patience):
                stopped_early = True
                log.info("early stop: validation loss has not improved for %d epochs "
                         "(best: epoch %d)", cfg.patience, best_epoch)
                break
    write_text_atomic(run_dir / "summary.json", json.dumps({
        "best_epoch": best_epoch, "best_selection_loss": best, "epochs_run": epoch,
        "stopped_early": stopped_early, "train_samples": len(train_data),
        "train_samples_full": len(full_train), "steps_per_epoch": len(sampler)}, indent=2))
    _write_curves(run_dir)
    return run_dir


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"cpu ({platform.processor() or platform.machine()}, "\
               f"{torch.get_num_threads()} threads)"
    return str(device)


def _write_curves(run_dir: Path) -> None:
    from capsmed.evaluate.plots import plot_training_curves

    records = [json.loads(line) for line in
               (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line]
    plot_training_curves(records, run_dir / "curves.png")
