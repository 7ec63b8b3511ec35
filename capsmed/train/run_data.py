"""Which rows of the dataset file a run trains, validates and tests on, and their loaders.

Two kinds of file:

* train / val / test splits: train on (a data challenge's subset of) ``train``, select the
  checkpoint on ``val``, test on ``test``;
* cross-validation (split ``all`` with ``folds``, e.g. AML): ``--fold K`` trains on
  the other folds and tests on fold K (paper 001: no validation set, the last epoch is
  kept).

The rows are saved in the run directory (``train_indices.npy``, ``test_indices.npy``
for a fold) so ``capsmed evaluate RUN_DIR`` tests on exactly the held-out rows
(:mod:`capsmed.runs.rows` reads them back).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from capsmed.data.challenges import (
    cv_partition,
    select_training_indices,
    warn_classes_under_limit,
)
from capsmed.data.contract import (
    SECOND_LABEL,
    DatasetInfo,
    checked_second_labels,
    is_two_label,
    meta_names,
    read_images,
    read_labels,
    read_meta,
)
from capsmed.data.loader import DeviceSplit, StreamingSplit, should_stream, split_nbytes
from capsmed.errors import CapsmedError, first_line
from capsmed.train.config import TrainConfig

log = logging.getLogger(__name__)

CV_SPLIT = "all"
TRAIN_ROWS, TEST_ROWS = "train_indices.npy", "test_indices.npy"  # in the run folder


def read_saved_rows(path: Path) -> np.ndarray:
    """A run folder's saved row indices (:data:`TRAIN_ROWS`, :data:`TEST_ROWS`), or one
    line naming the file."""
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise CapsmedError(f"{path}: cannot read the saved rows ({first_line(exc)})"
                           ) from None


@dataclass(frozen=True)
class RunRows:
    """Rows of the file a run uses.

    Attributes:
        train_split: Split the training rows index (``train``, or ``all`` under CV).
        train_rows: Training rows after every data challenge (sorted).
        full_train_size: Training rows after the per-class limit, before fraction and
            imbalance (the paper-000 rule "same iterations as the full set").
        val_split: Split used for checkpoint selection, or None.
        test_split: Split ``evaluate`` tests on.
        test_rows: Rows of ``test_split`` to test on; None = all of them.
    """

    train_split: str
    train_rows: np.ndarray
    full_train_size: int
    val_split: str | None
    test_split: str
    test_rows: np.ndarray | None


def select_rows(info: DatasetInfo, cfg: TrainConfig) -> RunRows:
    """Apply the run's data challenges to the file (labels only; no images are read)."""
    challenge = cfg.challenge
    if cfg.fold is None:
        if cfg.folds is not None:
            raise CapsmedError("--folds needs --fold K (which fold to test on)")
        if "train" not in info.split_sizes:
            hint = (" (it has cross-validation folds: pass --fold K)" if info.folds else "")
            raise CapsmedError(f"{info.path}: has no 'train' split{hint}")
        labels, _ = read_labels(info.path, "train")
        if cfg.per_class_limit is not None:
            warn_classes_under_limit(labels, info.class_names, cfg.per_class_limit)
        rows = select_training_indices(labels, info.class_names, challenge, cfg.seed)
        _check_not_empty(info, "'train'", len(labels), rows)
        full = len(labels) if cfg.per_class_limit is None else int(np.minimum(
            np.bincount(labels, minlength=info.num_classes), cfg.per_class_limit).sum())
        val = "val" if info.split_sizes.get("val") else None
        if val is not None:
            _check_same_targets(info, "train", val)
        return RunRows("train", rows, full, val, "test", None)
    if CV_SPLIT not in info.folds:
        raise CapsmedError(f"{info.path}: --fold needs a file written with cross-validation "
                           f"folds (split '{CV_SPLIT}' + folds), e.g. capsmed preprocess aml")
    if cfg.folds is not None and cfg.folds != info.folds[CV_SPLIT]:
        raise CapsmedError(f"{info.path}: has {info.folds[CV_SPLIT]} folds, not --folds "
                           f"{cfg.folds}")
    labels, folds = read_labels(info.path, CV_SPLIT)
    assert folds is not None
    try:
        train_rows, test_rows = cv_partition(labels, folds, cfg.fold, cfg.per_class_limit,
                                             cfg.seed)
    except CapsmedError as exc:  # the fold is out of the file's range: name the file
        raise CapsmedError(f"{info.path}: {exc}") from None
    if cfg.per_class_limit is not None:  # the limit is drawn from every fold's samples
        warn_classes_under_limit(labels, info.class_names, cfg.per_class_limit)
    rest = dataclasses.replace(challenge, per_class_limit=None)  # already applied
    chosen = select_training_indices(labels[train_rows], info.class_names, rest, cfg.seed)
    _check_not_empty(info, f"'{CV_SPLIT}' without fold {cfg.fold}", len(train_rows), chosen)
    return RunRows(CV_SPLIT, train_rows[chosen], len(train_rows), None, CV_SPLIT, test_rows)


def _check_same_targets(info: DatasetInfo, train: str, val: str) -> None:
    """Refuse a validation split that holds one label per image where training holds
    two (MultiMNIST's ``meta/label2``), or the reverse: the checkpoint would be chosen
    on another task than the one trained."""
    two = {split: is_two_label(info.path, split) for split in (train, val)}
    if two[train] != two[val]:
        has, lacks = (train, val) if two[train] else (val, train)
        raise CapsmedError(f"{info.path}: '{has}' holds two labels per image "
                           f"(meta/{SECOND_LABEL}) but '{lacks}' one: validation would "
                           f"score another task than training; give both splits "
                           f"meta/{SECOND_LABEL} or neither")


def _check_not_empty(info: DatasetInfo, split: str, available: int, chosen: np.ndarray
                     ) -> None:
    """``split``: the training samples' place in words (``'train'``, ``'all' without
    fold 2``)."""
    if not available:
        raise CapsmedError(f"{info.path}: the training split {split} is empty")
    if not len(chosen):
        raise CapsmedError(f"{info.path}: the data challenges (--fraction, --imbalance, "
                           f"--per-class-limit) leave none of the {available} training "
                           f"samples of {split}")


def load_train_images(info: DatasetInfo, rows: RunRows) -> np.ndarray:
    """The training images held in memory (uint8), in ``rows.train_rows`` order."""
    return read_images(info.path, rows.train_split, rows.train_rows)


def make_loader(info: DatasetInfo, split: str, rows: np.ndarray | None, cfg: TrainConfig,
                device: torch.device, images: np.ndarray | None = None
                ) -> DeviceSplit | StreamingSplit:
    """A device-resident or streaming loader for ``rows`` of ``split`` (``cfg.data_loading``)."""
    labels, _ = read_labels(info.path, split)
    if rows is not None:
        labels = labels[rows]
    n = len(labels)
    if SECOND_LABEL in meta_names(info.path, split):
        return _two_label_loader(info, split, rows, labels, cfg, device, images)
    if should_stream(cfg.data_loading, split_nbytes(info.path, split, n), device):
        log.info("streaming '%s' (%d images) from %s with %d reader(s)", split, n, info.path,
                 cfg.loader_workers)
        all_rows = rows if rows is not None else np.arange(n)
        return StreamingSplit(info.path, split, all_rows, labels, device, cfg.loader_workers)
    if images is None:
        images = read_images(info.path, split, rows)
    return DeviceSplit(images, labels, device)


def _two_label_loader(info: DatasetInfo, split: str, rows: np.ndarray | None,
                      labels: np.ndarray, cfg: TrainConfig, device: torch.device,
                      images: np.ndarray | None) -> DeviceSplit:
    """A two-object split (MultiMNIST: meta ``label2``, ``image_a``/``image_b``)."""
    if cfg.data_loading == "stream":
        raise CapsmedError(f"{info.path}: two-label sets are held in memory; use "
                           "--data-loading memory")
    names = meta_names(info.path, split)
    second = checked_second_labels(labels, read_meta(info.path, split, SECOND_LABEL, rows),
                                   info.num_classes, info.path, split,
                                   needs="two-label training")
    sources = None
    if {"image_a", "image_b"} <= set(names):
        shape = (len(labels), info.channels, *info.image_size)
        pair = [read_meta(info.path, split, n, rows) for n in ("image_a", "image_b")]
        for name, values in zip(("image_a", "image_b"), pair, strict=True):
            # another shape would broadcast against the reconstruction, silently
            if values.dtype != np.uint8 or values.shape != shape:
                raise CapsmedError(f"{info.path}: '{split}/meta/{name}' must be uint8 "
                                   f"{list(shape)} like '{split}/images' (each object's "
                                   f"own image), got {values.dtype} {list(values.shape)}")
        sources = np.stack(pair, axis=1)
    else:
        log.warning("%s: no per-object source images (image_a/image_b); the two-label "
                    "run trains without the per-object reconstruction loss (an unmasked "
                    "decoder still reconstructs the whole input)", info.path)
    if images is None:
        images = read_images(info.path, split, rows)
    return DeviceSplit(images, labels, device, second=second, sources=sources)


def channel_statistics(images: np.ndarray) -> dict[str, list[float]]:
    """Per-channel mean and std of uint8 images [N, C, H, W], on the [0, 1] scale."""
    if len(images) == 0:
        raise CapsmedError("the training split is empty")
    sums = np.zeros(images.shape[1]), np.zeros(images.shape[1])
    for start in range(0, len(images), 4096):  # chunks: no float64 copy of a big set
        x = images[start:start + 4096].astype(np.float64) / 255.0
        sums[0][:] += x.sum(axis=(0, 2, 3))
        sums[1][:] += (x * x).sum(axis=(0, 2, 3))
    count = len(images) * images.shape[2] * images.shape[3]
    mean = sums[0] / count
    std = np.sqrt(np.maximum(sums[1] / count - mean * mean, 0.0))
    return {"input_mean": [round(float(v), 6) for v in mean],
            "input_std": [round(float(max(v, 1e-3)), 6) for v in std]}


def sample_for_statistics(info: DatasetInfo, rows: RunRows, limit: int = 20000
                          ) -> np.ndarray:
    """Training images for the standardisation statistics (a seeded sample of big sets)."""
    chosen = rows.train_rows
    if len(chosen) > limit:
        chosen = np.sort(np.random.default_rng(0).choice(chosen, limit, replace=False))
    return read_images(info.path, rows.train_split, chosen)
