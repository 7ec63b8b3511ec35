"""What a run refuses or warns about at start, before anything is written: training
rows lacking classes, a device mode the device cannot run, what two-label data cannot
do, a batch of one image under batch norm, a resumed run whose options no longer
select the rows it trained on."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from capsmed.data.contract import DatasetInfo, is_two_label, read_labels
from capsmed.errors import CapsmedError
from capsmed.train import distributed
from capsmed.train.config import TrainConfig
from capsmed.train.run_data import TEST_ROWS, TRAIN_ROWS, RunRows, read_saved_rows

log = logging.getLogger(__name__)


def check_training_classes(info: DatasetInfo, rows: RunRows) -> None:
    """Warn when the training rows lack classes: with one class the model learns nothing
    that tells classes apart and calls every image that class; a missing class it
    cannot learn to predict. (A warning, not a refusal: a slide-labelled set can have
    a split of one class by design, and some studies train on such a split.)"""
    labels, _ = read_labels(info.path, rows.train_split)
    present = set(np.unique(labels[rows.train_rows]).tolist())
    names = info.class_names
    if len(present) == 1:
        only = names[present.pop()]
        log.warning("%s: the training rows hold one class only (%s) of the %d in the file: "
                    "the model learns nothing that tells classes apart and will call every "
                    "image %s (check the split, or the data challenges)", info.path, only,
                    len(names), only)
        return
    missing = [name for k, name in enumerate(names) if k not in present]
    if missing:
        log.warning("%s: the training rows hold no sample of %s: the model cannot learn to "
                    "predict %s", info.path, ", ".join(missing),
                    "it" if len(missing) == 1 else "them")


def check_two_labels(info: DatasetInfo, cfg: TrainConfig, rows: RunRows,
                     ctx: distributed.Distributed) -> bool:
    """Whether targets are two labels (MultiMNIST); refuses what those cannot do."""
    if not is_two_label(info.path, rows.train_split):
        return False
    clash = [name for name, on in (("--class-weights", cfg.class_weights),
                                   ("--augment", cfg.augment),
                                   ("--cuda-graph", cfg.cuda_graph),
                                   ("torchrun", ctx.enabled),
                                   # these count the first object's class only: a
                                   # class stays as the second object
                                   ("--imbalance", cfg.imbalance),
                                   ("--per-class-limit", cfg.per_class_limit is not None))
             if on]
    if clash:
        raise CapsmedError(f"{info.path}: two-label training (MultiMNIST) does not "
                           f"support {', '.join(clash)}")
    log.info("two-label set: both classes are targets, each object is reconstructed "
             "from its own capsule (Sabour et al.)")
    return True


def check_cuda_graph(cfg: TrainConfig, device: torch.device, ctx: distributed.Distributed,
                     precision: str) -> None:
    """Refuse ``--cuda-graph`` where a graph cannot replay the step."""
    if not cfg.cuda_graph:
        return
    problem = (
        f"needs a CUDA device (this run's is {device})" if device.type != "cuda" else
        "does not work with fp16 (its loss scaler decides on the host); use --precision "
        "bf16 or fp32" if precision == "fp16" else
        "does not work under torchrun" if ctx.enabled else "")
    if problem:
        raise CapsmedError(f"--cuda-graph {problem}")


def check_single_image_batches(model: torch.nn.Module, batch_sizes: set[int],
                                ctx: distributed.Distributed, input_shape: tuple[int, ...],
                                device: torch.device) -> None:
    """Refuse a run whose batches (or one rank's share of one) can hold a single image
    when its batch norm cannot train on one at this input size (a 1x1 map): it stopped
    with a traceback at the end of its first epoch, its folder written, and --resume
    met the same batch. Probed on one image, before anything is written; the model's
    buffers and the random generators are left as they were."""
    shares = {len(range(rank, size, ctx.world)) for size in batch_sizes
              for rank in range(ctx.world)}  # each process's batch[rank::world]
    if 1 not in shares or not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                                  for m in model.modules()):
        return
    buffers = [b.detach().clone() for b in model.buffers()]
    was_training = model.training
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            model.train()
            model(torch.zeros(1, *input_shape, device=device))
    except ValueError as exc:
        if "Expected more than 1 value per channel" not in str(exc):
            raise
        sizes = " and ".join(map(str, sorted(batch_sizes, reverse=True)))
        over = f", shared by {ctx.world} processes" if ctx.world > 1 else ""
        raise CapsmedError(
            f"this run's batches of {sizes} images{over} give a step a single image, and "
            f"the model's batch norm cannot train on one image at input size "
            f"{'x'.join(map(str, input_shape[1:]))}; choose a --batch-size that leaves "
            f"no batch of one") from None
    finally:
        with torch.no_grad():
            for saved, buffer in zip(buffers, model.buffers(), strict=True):
                buffer.copy_(saved)
        model.train(was_training)


def warn_unused_recon_weight(cfg: TrainConfig, model: torch.nn.Module) -> None:
    """Warn when a reconstruction weight was given (not the domain's default) for a model
    without a reconstruction decoder: nothing uses it, yet config.yaml records it. A
    warning, not a refusal: a study sets one weight for all its models (the ConvNets
    and the no-reconstruction ablations of pipelines/gu2021.yaml among them)."""
    if cfg.recon_weight and getattr(model, "decoder", None) is None:
        log.warning("recon_weight %g has no effect on %s%s: it has no reconstruction "
                    "decoder (config.yaml records the weight all the same)",
                    cfg.recon_weight, cfg.arch,
                    " with reconstruction=none" if cfg.model_kwargs.get("reconstruction")
                    == "none" else "")


def check_saved_rows(run_dir: Path, rows: RunRows) -> None:
    """On resume: the options in config.yaml still select the rows the run trained on
    (an edited fraction, seed or fold would train the rest of the run on others)."""
    for name, values in ((TRAIN_ROWS, rows.train_rows), (TEST_ROWS, rows.test_rows)):
        path = run_dir / name
        if values is None or not path.is_file():
            continue
        saved = read_saved_rows(path)
        if not np.array_equal(saved, values):
            raise CapsmedError(f"{path}: the run trained on other rows than its "
                               f"config.yaml selects now ({len(saved)} saved, "
                               f"{len(values)} now): its options were edited after it "
                               "started; restore them, or train a new run")
