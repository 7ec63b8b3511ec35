"""A training run's set-up: its data, model, optimiser and self-describing folder.

:class:`Run` is what :func:`capsmed.train.engine.train` and ``resume`` build and
:func:`capsmed.train.loop.run_loop` trains.

A run directory describes itself: ``config.yaml`` (resolved options, model arguments,
environment), ``preprocessing.json`` (the dataset's preprocessing record, which
``capsmed predict`` replays), ``train_indices.npy`` (+ ``test_indices.npy`` for a cross-validation
fold), ``metrics.jsonl``, the checkpoint at minimum validation loss, ``resume.pt``
while the run is unfinished, ``summary.json`` and ``curves.png`` at the end.
"""

from __future__ import annotations

import datetime as dt
import importlib
import logging
import math
import os
import platform
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from capsmed import __version__
from capsmed.data.contract import DatasetInfo, is_two_label
from capsmed.data.digest import file_digest
from capsmed.data.record import write_record
from capsmed.device import device_name, seed_everything
from capsmed.errors import CapsmedError, first_line
from capsmed.io import atomic_dir, atomic_path, write_text_atomic, writing
from capsmed.models import count_parameters
from capsmed.train import distributed
from capsmed.train.augment import get_recipe
from capsmed.train.config import TrainConfig
from capsmed.train.losses import balanced_class_weights
from capsmed.train.model_options import build_model
from capsmed.train.optim import build_optimizer, build_schedule
from capsmed.train.protocol import PROTOCOL_REVISION
from capsmed.train.run_data import (
    TEST_ROWS,
    TRAIN_ROWS,
    RunRows,
    channel_statistics,
    make_loader,
    sample_for_statistics,
    select_rows,
)
from capsmed.train.sampling import BatchSampler
from capsmed.train.state import Progress, save_state
from capsmed.train.step import StepSettings, TrainStep, prepare_model, resolve_precision

log = logging.getLogger(__name__)


def check_free_space(run_dir: Path, model: torch.nn.Module) -> None:
    """Fail now, not after hours, if the run directory cannot be written or cannot hold
    the run's files.

    A checkpoint is written beside the previous one before replacing it, hence two;
    the resumable state holds the weights and up to two optimiser moments; plus a
    margin for metrics, curves and the report.
    """
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    need = 2 * weights + 2 * 3 * weights + 32 * 2**20
    existing = next(p for p in (run_dir, *run_dir.absolute().parents) if p.exists())
    # a read-only mount reports little or no free space: say what is really wrong
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise CapsmedError(f"{run_dir}: cannot write there: {existing} is on a read-only "
                           "file system; choose another --out")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CapsmedError(f"{run_dir}: cannot write there: {existing} is not writable; "
                           "choose another --out")
    free = shutil.disk_usage(existing).free
    if free < need:
        raise CapsmedError(f"{run_dir}: only {free / 2**20:,.0f} MiB free, a run of this "
                           f"model needs about {need / 2**20:,.0f} MiB; free some space or "
                           "choose another --out")


def _default_run_dir(cfg: TrainConfig, info: DatasetInfo) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    fold = f"-f{cfg.fold}" if cfg.fold is not None else ""
    return Path("runs") / f"{info.dataset}-{cfg.arch}{fold}-s{cfg.seed}-{stamp}"


def _check_new_run_dir(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise CapsmedError(f"{path}: is a file, not a run directory; choose another --out")
    if path.exists() and any(path.iterdir()):
        hint = (f", or continue it with capsmed train --resume {path}"
                if (path / "resume.pt").is_file() else "")
        raise CapsmedError(f"{path}: run directory already exists and is not empty; "
                           f"choose another --out or remove it{hint}")


def hold_run_lock(run_dir: Path) -> int | None:
    """Hold ``run_dir``'s lock while this process trains it: a second ``capsmed train
    --resume`` of a run in progress would append every epoch twice. An advisory lock
    (flock) on the folder itself: no file to leave behind, and the system releases it
    when the process ends, however it ends. Returns the descriptor to close."""
    try:
        import fcntl
    except ImportError:  # not on this platform: no lock
        return None
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise CapsmedError(f"{run_dir}: is being trained by another process; wait for it "
                           "to finish, or stop it first") from None
    return fd


def _check_saved_rows(run_dir: Path, rows: RunRows) -> None:
    """On resume: the options in config.yaml still select the rows the run trained on
    (an edited fraction, seed or fold would train the rest of the run on others)."""
    for name, values in ((TRAIN_ROWS, rows.train_rows), (TEST_ROWS, rows.test_rows)):
        path = run_dir / name
        if values is None or not path.is_file():
            continue
        try:
            saved = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise CapsmedError(f"{path}: cannot read the saved rows ({first_line(exc)})"
                               ) from None
        if not np.array_equal(saved, values):
            raise CapsmedError(f"{path}: the run trained on other rows than its "
                               f"config.yaml selects now ({len(saved)} saved, "
                               f"{len(values)} now): its options were edited after it "
                               "started; restore them, or train a new run")


def _save_rows(run_dir: Path, rows: RunRows) -> None:
    for name, values in ((TRAIN_ROWS, rows.train_rows), (TEST_ROWS, rows.test_rows)):
        if values is not None:
            with atomic_path(run_dir / name) as tmp, writing(run_dir / name), \
                    tmp.open("wb") as fh:
                np.save(fh, values)


def transfer_parameters(model: torch.nn.Module, source: Path, prefixes: list[str],
                        freeze: bool) -> list[str]:
    """Copy the parameters whose names start with one of ``prefixes`` from the checkpoint
    in run directory ``source`` (paper 003's layer transfer), with their buffers (batch
    norms' running statistics, which the copied weights were trained with); optionally
    freeze the parameters.

    Raises:
        CapsmedError: if a prefix matches nothing or shapes differ.
    """
    from safetensors.torch import load_file

    from capsmed.train.checkpoint import WEIGHTS

    path = Path(source) / WEIGHTS
    if not path.is_file():
        raise CapsmedError(f"{path}: no checkpoint to transfer from")
    weights = load_file(str(path))
    params = dict(model.named_parameters())
    copied = []
    for prefix in prefixes:
        names = [n for n in params if n == prefix or n.startswith(prefix + ".")]
        if not names:
            tops = ", ".join(sorted({n.split(".")[0] for n in params}))
            raise CapsmedError(f"transfer layer '{prefix}' matches no parameter of the "
                               f"model (it has: {tops})")
        for name in names:
            if name not in weights or weights[name].shape != params[name].shape:
                raise CapsmedError(f"{path}: parameter '{name}' is missing or has another "
                                   "shape; transfer between the same architecture and input")
            with torch.no_grad():
                params[name].copy_(weights[name])
            params[name].requires_grad_(not freeze)
            copied.append(name)
        for name, buffer in model.named_buffers():  # batch norms' running statistics
            if (name == prefix or name.startswith(prefix + ".")) and name in weights \
                    and weights[name].shape == buffer.shape:
                with torch.no_grad():
                    buffer.copy_(weights[name])
    log.info("transferred %d parameter tensors from %s%s", len(copied), source,
             " (frozen)" if freeze else "")
    return copied


class Run:
    """Everything a training run holds; built by :func:`train` or :func:`resume`."""

    def __init__(self, cfg: TrainConfig, info: DatasetInfo, ctx: distributed.Distributed,
                 device: torch.device, run_dir: Path | None, model_kwargs: dict | None,
                 disable_progress: bool | None) -> None:
        self.cfg, self.info, self.ctx, self.device = cfg, info, ctx, device
        # None defers to the global setting (capsmed -q); other ranks never show bars
        self.disable_progress = disable_progress if ctx.is_main else True
        # what config.yaml records and --resume / evaluate compare (one digest for all)
        self.data_digest = file_digest(info.path)
        self.rows = select_rows(info, cfg)  # before anything is written
        self.two_labels = is_two_label(info.path, self.rows.train_split)
        if self.two_labels:
            clash = [name for name, on in (("--class-weights", cfg.class_weights),
                                           ("--augment", cfg.augment),
                                           ("torchrun", ctx.enabled)) if on]
            if clash:
                raise CapsmedError(f"{info.path}: two-label training (MultiMNIST) does not "
                                   f"support {', '.join(clash)}")
            log.info("two-label set: both classes are targets, each object is "
                     "reconstructed from its own capsule (Sabour et al.)")
        if model_kwargs is None:  # a new run: statistics of its own training rows
            stats = (channel_statistics(sample_for_statistics(info, self.rows))
                     if cfg.standardize else {})
            model_kwargs = {"in_channels": info.channels, "num_classes": info.num_classes,
                            "input_size": list(info.image_size), **stats,
                            **cfg.model_kwargs}
        self.model_kwargs = model_kwargs
        if cfg.tensorboard:
            try:
                importlib.import_module("torch.utils.tensorboard")
            except ImportError:
                raise CapsmedError("--tensorboard needs the tensorboard package: pip install "
                                   "'capsmed[tensorboard]'") from None
        seed_everything(cfg.seed)  # the model's initialisation is what the seed fixes
        try:
            self.model = build_model(cfg.arch, model_kwargs,
                                     (info.channels, *info.image_size))
        except CapsmedError as exc:
            if run_dir is None:
                raise
            raise CapsmedError(f"{run_dir / 'config.yaml'}: {exc}") from None  # resumed
        if cfg.transfer_from:
            transfer_parameters(self.model, Path(cfg.transfer_from), cfg.transfer_layers,
                                cfg.freeze_transferred)
        new = run_dir is None
        if new:
            path = Path(cfg.out) if cfg.out else _default_run_dir(cfg, info)
            path = Path(ctx.broadcast_text(str(path)))
            _check_new_run_dir(path)
            check_free_space(path, self.model)
            run_dir = path
        self.run_dir = run_dir
        if not new:
            _check_saved_rows(run_dir, self.rows)
        self.train_data = make_loader(info, self.rows.train_split, self.rows.train_rows, cfg,
                                      device)
        self.val_data = (make_loader(info, self.rows.val_split, None, cfg, device)
                         if self.rows.val_split else None)
        if self.val_data is None:
            log.warning("%s: no validation data for this run: the last epoch's weights are "
                        "kept and there is no early stopping", info.path)

        channels_last = cfg.channels_last if cfg.channels_last is not None \
            else device.type == "cuda"
        self.model = prepare_model(self.model, device, channels_last, compile_model=False)
        self.model.train()
        self.optimizer = build_optimizer(
            cfg.optimizer, [q for q in self.model.parameters() if q.requires_grad], cfg.lr)
        self.schedule = build_schedule(cfg.lr_schedule, self.optimizer, cfg.lr_decay)
        module = self.model
        if ctx.enabled:
            module = torch.nn.parallel.DistributedDataParallel(
                module, device_ids=[device.index] if device.type == "cuda" else None)
        if cfg.compile:
            module = torch.compile(module)
        steps = cfg.steps_per_epoch
        if steps is None and not cfg.challenge.is_full:  # same iterations as the full set
            steps = math.ceil(self.rows.full_train_size / cfg.batch_size)
        self.sampler = BatchSampler(self.train_data.labels, cfg.batch_size, cfg.sampler,
                                    steps, torch.Generator().manual_seed(cfg.seed))
        weights = (balanced_class_weights(self.train_data.labels.to(device),
                                          info.num_classes)
                   if cfg.class_weights == "balanced" else None)
        augment = get_recipe(cfg.augment_recipe) if cfg.augment else None
        self.settings = StepSettings(
            loss_kind=self.model.loss_kind, recon_weight=cfg.recon_weight,
            autocast_dtype=resolve_precision(cfg.precision, device),
            channels_last=channels_last, class_weights=weights, augment=augment,
            augment_rng=(torch.Generator(device=device).manual_seed(cfg.seed + 1)
                         if augment is not None else None),
            decoder=self.model.decoder)
        self.step = TrainStep(module, self.optimizer, self.settings)
        self.environment = {"capsmed": __version__, "protocol_revision": PROTOCOL_REVISION,
                            "torch": str(torch.__version__),
                            "device": device_name(device),
                            "python": platform.python_version(),
                            "parameters": count_parameters(self.model),
                            "precision": str(self.settings.autocast_dtype or "float32"),
                            "world_size": ctx.world}
        log.debug("environment %s; training rows %d (%s), validation %s; %d steps per "
                  "epoch; options %s", self.environment, len(self.train_data),
                  self.rows.train_split, self.rows.val_split or "none", len(self.sampler),
                  cfg.to_dict())
        if new and ctx.is_main:
            self._create_folder()
        # last: a Run that exists holds its lock, which train() and resume() release
        self._lock = hold_run_lock(self.run_dir) if ctx.is_main else None
        if new:
            ctx.barrier()

    def release(self) -> None:
        """Let another process train this run directory (:func:`hold_run_lock`)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _create_folder(self) -> None:
        """Write the new run's folder whole or not at all: its rows, ``config.yaml`` and
        a resumable state before the first step, gathered in a temporary folder beside
        it and renamed into place. A run refused at start leaves nothing (the same
        command runs again), and one killed at any later moment, even in its first
        epoch, continues with ``--resume``."""
        with atomic_dir(self.run_dir) as staging:
            _save_rows(staging, self.rows)
            self._write_config(staging)
            write_record(staging, self.info)  # what capsmed predict replays
            self.save_state(Progress(), self.sampler.generator.get_state(), staging)

    def save_state(self, progress: Progress, sampler_state: torch.Tensor,
                   folder: Path | None = None) -> None:
        """Write ``resume.pt`` (into ``folder``, default the run directory)."""
        save_state(folder or self.run_dir, model=self.model, optimizer=self.optimizer,
                   schedule=self.schedule, scaler=self.step.scaler,
                   sampler_state=sampler_state, augment_rng=self.settings.augment_rng,
                   progress=progress)

    def _write_config(self, folder: Path) -> None:
        cfg, info = self.cfg, self.info
        resolved = {**cfg.to_dict(), "data": str(info.path.resolve()),
                    "out": str(self.run_dir)}
        write_text_atomic(folder / "config.yaml", yaml.safe_dump(
            {"train": resolved, "model_kwargs": self.model_kwargs,
             "environment": self.environment,
             "dataset": {"name": info.dataset, "source_kind": info.data_source().name,
                         "domain": info.image_domain().name,
                         "class_names": list(info.class_names),
                         "splits": info.split_sizes, "created": info.created,
                         "digest": self.data_digest,
                         "train_split": self.rows.train_split,
                         "val_split": self.rows.val_split,
                         "test_split": self.rows.test_split}}, sort_keys=False))

    def checkpoint_meta(self, epoch: int, val_loss: float | None) -> dict[str, Any]:
        return {"arch": self.cfg.arch, "model_kwargs": self.model_kwargs, "epoch": epoch,
                "val_loss": val_loss, "dataset": self.info.dataset,
                "class_names": list(self.info.class_names),
                "data": str(self.info.path.resolve()), "loss_kind": self.model.loss_kind,
                "format": 1}
