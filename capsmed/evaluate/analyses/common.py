"""What every analysis shares: open a run with its data, batched forward passes, and
atomic output files under ``RUN_DIR/analysis/<name>/``.

Every analysis computes all its numbers and figures first and writes afterwards, each
file atomically, so a failure leaves an earlier analysis of the same run untouched.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from capsmed.data.contract import (
    SECOND_LABEL,
    SplitData,
    load_split,
    read_labels,
)
from capsmed.errors import CapsmedError
from capsmed.io import write_text_atomic
from capsmed.models.common import ModelOutput
from capsmed.runs import OpenRun, open_run
from capsmed.runs.rows import read_rows
from capsmed.train.run_data import CV_SPLIT, TEST_ROWS

log = logging.getLogger(__name__)

ANALYSIS_DIR = "analysis"
# A transform applied to a float batch [B, C, H, W] in [0, 1]; ``start`` is the index of
# the batch's first image, so per-image parameters drawn up front can be looked up.
BatchTransform = Callable[[torch.Tensor, int], torch.Tensor]


def open_analysed(run_dir: Path, data: Path | None = None,
                  device: str | torch.device = "auto") -> OpenRun:
    """:func:`capsmed.runs.open_run`, warning (as ``capsmed evaluate`` does) when the
    run's training has not finished: its checkpoint is of an intermediate epoch."""
    run = open_run(run_dir, data, device)
    run.warn_if_unfinished("analyses", "analyse")
    return run


def held_out_rows(run: OpenRun, split: str) -> np.ndarray | None:
    """The rows of the file's :data:`CV_SPLIT` that :func:`load_samples` gives for a
    cross-validation run's ``test`` (its held-out fold), in that order; None when the
    samples are the file's ``split`` itself, row i being sample i."""
    path = run.run_dir / TEST_ROWS
    if split != "test" or not path.is_file() or not run.own_data:
        return None
    return read_rows(path, len(read_labels(run.data_path, CV_SPLIT)[0]),
                     f"{run.data_path}'s split '{CV_SPLIT}'")


def load_samples(run: OpenRun, split: str = "test", with_meta: bool = False,
                 max_samples: int | None = None, seed: int = 0) -> SplitData:
    """The samples of ``split`` the run is analysed on.

    For the run's own cross-validation file, ``test`` is its held-out fold (as in
    ``capsmed evaluate``). ``max_samples`` keeps a seeded random subset, in file order.
    """
    rows = held_out_rows(run, split)
    if rows is not None:
        samples = run.samples(split)
        if with_meta:  # the held-out rows' meta (MultiMNIST's second label and sources)
            whole = load_split(run.data_path, CV_SPLIT, with_meta=True)
            samples = SplitData(samples.images, samples.labels, samples.groups,
                                {k: v[rows] for k, v in whole.meta.items()})
    else:
        samples = load_split(run.data_path, split, with_meta=with_meta)
    if not len(samples):
        raise CapsmedError(f"{run.data_path}: split '{split}' has no samples")
    if max_samples is not None and len(samples) > max_samples:
        rows = np.sort(np.random.default_rng(seed).choice(len(samples), max_samples,
                                                          replace=False))
        samples = SplitData(samples.images[rows], samples.labels[rows], samples.groups[rows],
                            {k: v[rows] for k, v in samples.meta.items()})
    return samples


def as_float(images: np.ndarray, device: torch.device) -> torch.Tensor:
    """uint8 images [N, C, H, W] -> float [N, C, H, W] in [0, 1] on ``device``."""
    return torch.from_numpy(np.ascontiguousarray(images)).to(device).float().div_(255.0)


@torch.no_grad()
def forward_batches(model: nn.Module, images: np.ndarray, device: torch.device,
                    batch_size: int, transform: BatchTransform | None = None,
                    **kwargs: bool) -> Iterator[tuple[int, torch.Tensor, ModelOutput]]:
    """Yield ``(start, inputs, output)`` per batch of uint8 ``images``, optionally
    transformed on the device first; ``kwargs`` go to the model (``return_couplings``)."""
    if batch_size < 1:
        raise CapsmedError(f"batch size must be >= 1, got {batch_size}")
    model.eval()
    for start in range(0, len(images), batch_size):
        x = as_float(images[start:start + batch_size], device)
        if transform is not None:
            x = transform(x, start)
        yield start, x, model(x, **kwargs)


def predict(model: nn.Module, images: np.ndarray, device: torch.device, batch_size: int,
            transform: BatchTransform | None = None) -> np.ndarray:
    """Predicted classes [N] of uint8 ``images`` (after ``transform``, if given)."""
    preds = [out.scores.argmax(1).cpu() for _, _, out in
             forward_batches(model, images, device, batch_size, transform)]
    return torch.cat(preds).numpy() if preds else np.empty(0, dtype=np.int64)


def class_scores(model: nn.Module, images: np.ndarray, device: torch.device,
                 batch_size: int) -> np.ndarray:
    """Class scores [N, K] of uint8 ``images``."""
    scores = [out.scores.float().cpu() for _, _, out in
              forward_batches(model, images, device, batch_size)]
    return torch.cat(scores).numpy()


def accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
    return float((np.asarray(predicted) == np.asarray(labels)).mean()) if len(labels) else 0.0


def two_digit_hits(scores: np.ndarray, first: np.ndarray, second: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per image: both digits in the top two, the first found, the second found (paper
    004 s3.2: an image is right when its two highest classes are its two digits)."""
    top2 = np.argsort(-scores, axis=1, kind="stable")[:, :2]
    a = (top2 == first[:, None]).any(1)
    b = (top2 == second[:, None]).any(1)
    return a & b, a, b


def refuse_two_label(samples: SplitData, path: Path, split: str, analysis: str) -> None:
    """Refuse two-label ``samples`` (loaded with their meta) for an analysis that scores
    one class per image: its top-1 accuracy would only ask whether the first digit ranks
    highest. Checked on the samples, not the file: a cross-validation run's ``test`` is
    its held-out rows of the file's ``all`` split."""
    if SECOND_LABEL in samples.meta:
        raise CapsmedError(f"{path}: split '{split}' has two labels per image ({SECOND_LABEL}"
                           f"); analyze {analysis} scores one class per image, so use "
                           "capsmed analyze multimnist for two-digit accuracy")


def last_linear(model: nn.Module) -> tuple[str, nn.Linear]:
    """The model's last ``nn.Linear`` in registration order: for the ConvNets here that is
    the class layer, so its *input* is the penultimate representation."""
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)
             and not name.startswith("decoder")]
    if not found:
        raise CapsmedError(f"{type(model).__name__} has no fully connected layer to take a "
                           "representation from")
    return found[-1]


class CaptureInput:
    """Forward hook keeping the (flattened) input of a module during ``with``."""

    def __init__(self, module: nn.Module) -> None:
        self.module, self.value = module, None

    def __enter__(self) -> CaptureInput:
        def hook(_module: nn.Module, args: tuple, _output: Any) -> None:
            self.value = args[0].detach().flatten(1).clone()  # safe from in-place ops

        self.handle = self.module.register_forward_hook(hook)
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


def analysis_dir(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / ANALYSIS_DIR / name


def write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([[f"{v:.6g}" if isinstance(v, float) else v for v in row]
                      for row in rows])
    write_text_atomic(path, buffer.getvalue())


def written(out_dir: Path) -> list[str]:
    return sorted(p.name for p in Path(out_dir).iterdir() if not p.name.startswith("."))
