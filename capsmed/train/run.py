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
from capsmed.data.contract import DatasetInfo
from capsmed.data.digest import file_digest
from capsmed.data.record import write_record
from capsmed.device import device_name, seed_everything
from capsmed.errors import CapsmedError, shell_quoted
from capsmed.io import atomic_dir, atomic_path, write_text_atomic, writing
from capsmed.models import count_parameters
from capsmed.train import distributed
from capsmed.train.augment import get_recipe
from capsmed.train.config import TrainConfig
from capsmed.train.losses import TWO_LABEL_LOSSES, balanced_class_weights
from capsmed.train.model_options import build_model
from capsmed.train.optim import build_optimizer, build_schedule
from capsmed.train.protocol import PROTOCOL_REVISION
from capsmed.train.run_checks import (
    check_cuda_graph,
    check_saved_rows,
    check_single_image_batches,
    check_training_classes,
    check_two_labels,
)
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
from capsmed.train.state import Progress, run_options, save_state
from capsmed.train.step import (
    PRECISION_NAMES,
    EpochTally,
    GraphedTrainStep,
    StepSettings,
    TrainStep,
    precision_mode,
    prepare_model,
    resolve_precision,
)
from capsmed.train.transfer import (
    check_source_rows,
    keep_transferred,
    recorded_transfer,
    transfer_parameters,
)

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
        hint = (f", or continue it with capsmed train --resume {shell_quoted(path)}"
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


def _save_rows(run_dir: Path, rows: RunRows) -> None:
    for name, values in ((TRAIN_ROWS, rows.train_rows), (TEST_ROWS, rows.test_rows)):
        if values is not None:
            with atomic_path(run_dir / name) as tmp, writing(run_dir / name), \
                    tmp.open("wb") as fh:
                np.save(fh, values)


class Run:
    """Everything a training run holds; built by :func:`train` or :func:`resume`.

    ``run_dir`` and ``model_kwargs`` are None for a new run (chosen and measured here)
    and given by a resumed one (its folder and its ``config.yaml``). The set-up steps
    run in this order: what is refused costs nothing and writes nothing; the seed is
    set right before the model is built; the folder is written last, whole.
    """

    def __init__(self, cfg: TrainConfig, info: DatasetInfo, ctx: distributed.Distributed,
                 device: torch.device, run_dir: Path | None, model_kwargs: dict | None,
                 disable_progress: bool | None) -> None:
        self.cfg, self.info, self.ctx, self.device = cfg, info, ctx, device
        # None defers to the global setting (capsmed -q); other ranks never show bars
        self.disable_progress = disable_progress if ctx.is_main else True
        self.precision = self._check_device_modes(run_dir)
        # what config.yaml records and --resume / evaluate compare (one digest for all)
        self.data_digest = file_digest(info.path)
        self.rows = select_rows(info, cfg)  # before anything is written
        check_training_classes(info, self.rows)
        # a resumed transfer run's copied layers are in its resume.pt: its source,
        # checked when it started, is not read again (it may be gone, or retrained)
        self.transfer: dict[str, Any] | None = (
            recorded_transfer(run_dir) if run_dir is not None and cfg.transfer_from else None)
        if cfg.transfer_from and self.transfer is None:  # its layers never saw our tests
            check_source_rows(Path(cfg.transfer_from), self.data_digest,
                              self.rows.test_split, self.rows.test_rows)
        self.two_labels = check_two_labels(info, cfg, self.rows, ctx)
        self.model_kwargs = (model_kwargs if model_kwargs is not None
                             else self._new_model_kwargs())
        self.model = self._build_model(run_dir)
        new = run_dir is None
        self.run_dir = self._new_run_dir() if new else run_dir
        if not new:
            check_saved_rows(self.run_dir, self.rows)
        self._load_data()
        self._build_optimisation()
        self._build_step()
        check_single_image_batches(self.model, self.sampler.batch_sizes(), ctx,
                                   (info.channels, *info.image_size), device)
        self.environment = self._describe_environment()
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

    def _check_device_modes(self, run_dir: Path | None) -> str:
        """The precision mode run here; refuses tf32 or --cuda-graph where they cannot
        work (a resumed run's options come from its config.yaml, named then)."""
        try:
            precision = precision_mode(self.cfg.precision, self.device)
            check_cuda_graph(self.cfg, self.device, self.ctx, precision)
        except CapsmedError as exc:
            if run_dir is None:
                raise
            raise CapsmedError(f"{run_dir / 'config.yaml'}: the run's options ask for it: "
                               f"{exc}") from None
        return precision

    def _new_model_kwargs(self) -> dict[str, Any]:
        """A new run's model arguments: the data's shape and classes, the statistics of
        its own training rows, and the user's options."""
        info, cfg = self.info, self.cfg
        stats: dict[str, Any] = {}
        if cfg.transfer_from:  # the copied layers' input scaling
            stats = self._source_statistics(Path(cfg.transfer_from))
            if stats and not cfg.standardize:
                raise CapsmedError(f"{cfg.transfer_from}: standardised its inputs, and the "
                                   "layers it lends were trained on them so; drop "
                                   "--no-standardize (a transfer run standardises as its "
                                   "source did)")
        elif cfg.standardize:
            stats = channel_statistics(sample_for_statistics(info, self.rows))
        return {"in_channels": info.channels, "num_classes": info.num_classes,
                "input_size": list(info.image_size), **stats, **cfg.model_kwargs}

    def _source_statistics(self, source: Path) -> dict[str, Any]:
        """The standardisation of the run layers are transferred from: the copied (and
        frozen) layers were trained on inputs scaled by it, not by this data's own."""
        from capsmed.train.run_config import read_run_config

        kwargs = read_run_config(source).get("model_kwargs") or {}
        stats = {k: kwargs[k] for k in ("input_mean", "input_std") if kwargs.get(k)}
        log.info("standardising as %s did (%s): its layers were trained so", source,
                 ", ".join(f"{k}={v}" for k, v in stats.items()) or "not at all")
        return stats

    def _build_model(self, run_dir: Path | None) -> torch.nn.Module:
        """The seeded model (with layers transferred from another run, if asked); a
        resumed run's model options that no longer build name its config.yaml."""
        cfg, info = self.cfg, self.info
        seed_everything(cfg.seed)  # the model's initialisation is what the seed fixes
        try:
            model = build_model(cfg.arch, self.model_kwargs, (info.channels, *info.image_size))
        except CapsmedError as exc:
            if run_dir is None:
                raise
            raise CapsmedError(f"{run_dir / 'config.yaml'}: {exc}") from None
        if cfg.transfer_from and self.transfer is not None:  # resumed: weights to come
            keep_transferred(model, cfg.transfer_layers, cfg.freeze_transferred)
        elif cfg.transfer_from:  # the source, as config.yaml records it
            self.transfer = transfer_parameters(
                model, Path(cfg.transfer_from), cfg.transfer_layers, cfg.freeze_transferred,
                arch=cfg.arch, classes=list(info.class_names), model_kwargs=self.model_kwargs)
        return model

    def _new_run_dir(self) -> Path:
        """The new run's folder (``--out`` or a stamped name), checked empty and roomy."""
        path = Path(self.cfg.out) if self.cfg.out else _default_run_dir(self.cfg, self.info)
        path = Path(self.ctx.broadcast_text(str(path)))
        _check_new_run_dir(path)
        check_free_space(path, self.model)
        return path

    def _load_data(self) -> None:
        info, rows, cfg, device = self.info, self.rows, self.cfg, self.device
        self.train_data = make_loader(info, rows.train_split, rows.train_rows, cfg, device)
        self.val_data = (make_loader(info, rows.val_split, None, cfg, device)
                         if rows.val_split else None)
        if self.val_data is None:
            log.warning("%s: no validation data for this run: the last epoch's weights are "
                        "kept and there is no early stopping", info.path)

    def _build_optimisation(self) -> None:
        """The model on its device, its optimiser and schedule, and the module each step
        calls (wrapped for torchrun, compiled on request)."""
        cfg, device = self.cfg, self.device
        self.channels_last = (cfg.channels_last if cfg.channels_last is not None
                              else device.type == "cuda")
        self.model = prepare_model(self.model, device, self.channels_last,
                                   compile_model=False)
        self.model.train()
        self.optimizer = build_optimizer(
            cfg.optimizer, [q for q in self.model.parameters() if q.requires_grad], cfg.lr)
        self.schedule = build_schedule(cfg.lr_schedule, self.optimizer, cfg.lr_decay)
        module = self.model
        if self.ctx.enabled:
            module = torch.nn.parallel.DistributedDataParallel(
                module, device_ids=[device.index] if device.type == "cuda" else None)
        if cfg.compile:
            module = torch.compile(module)
        self.module = module

    def _build_step(self) -> None:
        """The batch sampler, the step's settings (loss, precision, class weights,
        augmentation) and the step, which sums its figures into ``tally``."""
        cfg, device, info = self.cfg, self.device, self.info
        if self.two_labels and self.model.loss_kind not in TWO_LABEL_LOSSES:
            # refused here, not at the first step: that left a run folder behind
            raise CapsmedError(f"{info.path}: two-label training (MultiMNIST) supports "
                               f"{' and '.join(TWO_LABEL_LOSSES)} losses; {cfg.arch} trains "
                               f"with the {self.model.loss_kind} loss")
        steps = cfg.steps_per_epoch
        if steps is None and (cfg.fraction not in (None, 1.0) or cfg.imbalance):
            # paper 000: a subset trains as many iterations as one pass over the full
            # split (after --per-class-limit, which sets what "full" is, with or without
            # folds); a per-class limit alone trains one pass over what it keeps
            steps = math.ceil(self.rows.full_train_size / cfg.batch_size)
        self.sampler = BatchSampler(self.train_data.labels, cfg.batch_size, cfg.sampler,
                                    steps, torch.Generator().manual_seed(cfg.seed))
        weights = (balanced_class_weights(self.train_data.labels.to(device),
                                          info.num_classes)
                   if cfg.class_weights == "balanced" else None)
        augment = get_recipe(cfg.augment_recipe) if cfg.augment else None
        if augment is not None and augment.hed and self.info.channels != 3:
            raise CapsmedError(f"{self.info.path}: HED colour jitter (hed=...) needs RGB "
                               f"images; these have {self.info.channels} channel(s)")
        self.settings = StepSettings(
            loss_kind=self.model.loss_kind, recon_weight=cfg.recon_weight,
            autocast_dtype=resolve_precision(cfg.precision, device),
            channels_last=self.channels_last, class_weights=weights, augment=augment,
            augment_rng=(torch.Generator(device=device).manual_seed(cfg.seed + 1)
                         if augment is not None else None),
            decoder=self.model.decoder)
        self.tally = EpochTally(device)
        self.train_step = TrainStep(self.module, self.optimizer, self.settings, self.tally)
        self.step: TrainStep | GraphedTrainStep = (
            GraphedTrainStep(self.train_step) if cfg.cuda_graph else self.train_step)

    def _describe_environment(self) -> dict[str, Any]:
        """What config.yaml records of the software and hardware the run trains on."""
        return {"capsmed": __version__, "protocol_revision": PROTOCOL_REVISION,
                "torch": str(torch.__version__), "device": device_name(self.device),
                "python": platform.python_version(),
                "parameters": count_parameters(self.model),
                # what --precision is here: float32 (IEEE: TF32 off), tf32, bfloat16
                # or float16 (autocast; routing and loss in IEEE float32)
                "precision": PRECISION_NAMES[self.precision],
                "tf32": self.precision == "tf32",
                "world_size": self.ctx.world}

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
                   schedule=self.schedule, scaler=self.train_step.scaler,
                   sampler_state=sampler_state, augment_rng=self.settings.augment_rng,
                   progress=progress, options=self.options)

    @property
    def options(self) -> str:
        """What the run computes from, recorded in ``resume.pt`` (:func:`run_options`)."""
        return run_options(self.cfg.to_dict(), self.model_kwargs)

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
                         "test_split": self.rows.test_split,
                         **({"folds": info.folds[self.rows.train_split]}
                            if cfg.fold is not None else {})},
             **({"transfer": self.transfer} if self.transfer else {})}, sort_keys=False))

    def checkpoint_meta(self, epoch: int, val_loss: float | None) -> dict[str, Any]:
        return {"arch": self.cfg.arch, "model_kwargs": self.model_kwargs, "epoch": epoch,
                "val_loss": val_loss, "dataset": self.info.dataset,
                "class_names": list(self.info.class_names),
                "data": str(self.info.path.resolve()), "loss_kind": self.model.loss_kind,
                "format": 1}
