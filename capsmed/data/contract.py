"""The HDF5 dataset contract (SPEC section 3): one file per preprocessed dataset.

Layout::

    /<split>/images   uint8 [N, C, H, W], chunked, gzip-compressed (older files: lzf);
                      attrs axes "N,C,H,W", value_range [0, 255]
    /<split>/labels   int64 [N]; attr class_names (JSON)
    /<split>/groups   str   [N]   case / patient / slide id each sample came from
    /<split>/meta/*   optional per-sample arrays, 1-D or N-D (source file, row, col,
                      a second label, source images, ...)
    /<split>/folds    optional int8 [N]: cross-validation fold of each sample (usually
                      in a split named ``all``); groups never span two folds
    file attrs: format_version, dataset, class_names (JSON), image_size, channels,
                preprocessing (JSON), source (JSON), capsmed_version, created (UTC),
                provenance (JSON: command line, library versions)

The contract lives in three modules: :mod:`capsmed.data.writer` (:class:`DatasetWriter`,
the only writer), :mod:`capsmed.data.schema` (:class:`DatasetInfo`, :func:`read_info`:
what a file must hold, checked when it is opened) and this one, the readers, which
also re-exports the other two's public names so ``from capsmed.data.contract import
...`` serves every caller.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from capsmed.data.schema import (
    DATA_REVISION,
    FORMAT_VERSION,
    STRING_DTYPE,
    DatasetInfo,
    SplitData,
    read_info,
    reading,
    warn_if_older_revision,
)
from capsmed.data.writer import CHUNK_BYTES, DatasetWriter, find_leaks
from capsmed.errors import CapsmedError

__all__ = ["CHUNK_BYTES", "DATA_REVISION", "FORMAT_VERSION", "SECOND_LABEL", "DatasetInfo",
           "DatasetWriter", "SplitData", "class_counts", "find_leaks", "fold_class_counts",
           "fold_leaks", "groups_by_split", "is_two_label", "load_split", "meta_names",
           "read_images", "read_info", "read_labels", "read_meta", "warn_if_older_revision"]

# The meta array holding the second object's label in two-object sets (MultiMNIST).
SECOND_LABEL = "label2"


def load_split(path: Path, split: str, *, with_meta: bool = False) -> SplitData:
    """Load one split fully into memory (the 28-128 px sets fit easily)."""
    info = read_info(path)
    if split not in info.split_sizes:
        raise CapsmedError(f"{path}: has no '{split}' split (has: "
                           f"{', '.join(info.split_sizes)})")
    with reading(path) as f:
        grp = f[split]
        images = grp["images"][...]
        labels = grp["labels"][...].astype(np.int64)
        groups = grp["groups"].asstr()[...]
        folds = grp["folds"][...] if "folds" in grp else None
        meta = {}
        if with_meta and "meta" in grp:
            for name, ds in grp["meta"].items():
                meta[name] = ds.asstr()[...] if ds.dtype == STRING_DTYPE else ds[...]
    return SplitData(images=images, labels=labels, groups=groups, meta=meta, folds=folds)


def read_labels(path: Path, split: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Labels int64 [N] and folds int8 [N] (None without folds) of ``split``, no images."""
    info = read_info(path)
    if split not in info.split_sizes:
        raise CapsmedError(f"{path}: has no '{split}' split (has: "
                           f"{', '.join(info.split_sizes)})")
    with reading(path) as f:
        grp = f[split]
        return (grp["labels"][...].astype(np.int64),
                grp["folds"][...] if "folds" in grp else None)


def meta_names(path: Path, split: str) -> list[str]:
    """Names of the per-sample meta arrays of ``split``."""
    with reading(path) as f:
        grp = f[split]
        return sorted(grp["meta"].keys()) if "meta" in grp else []


def is_two_label(path: Path, split: str) -> bool:
    """Whether ``split`` of ``path`` holds two-object samples (a second label per image)."""
    return SECOND_LABEL in meta_names(path, split)


def checked_second_labels(labels: np.ndarray, second: np.ndarray, num_classes: int,
                          path: Path, split: str, needs: str = "two-digit accuracy"
                          ) -> np.ndarray:
    """Two-label images' second labels (meta ``label2``) as int64, refused (one line
    naming the file) unless each is a class index that differs from the image's first
    label: a label given twice is among the two highest classes whatever the other
    class is, and one outside the classes never is, so ``needs`` (training, two-digit
    accuracy) would be wrong unsaid. MultiMNIST never pairs a class with itself."""
    second = np.asarray(second)
    if second.shape != np.shape(labels) or second.dtype.kind not in "iu" or (
            len(second) and (second.min() < 0 or second.max() >= num_classes)):
        raise CapsmedError(f"{path}: '{split}/meta/{SECOND_LABEL}' must hold one label "
                           f"within 0..{num_classes - 1} per image, like '{split}/labels'")
    same = int((second == labels).sum())
    if same:
        raise CapsmedError(f"{path}: split '{split}' has {same} image(s) whose two labels "
                           f"(labels, meta/{SECOND_LABEL}) are the same class; {needs} "
                           "needs two different classes")
    return second.astype(np.int64)


def read_meta(path: Path, split: str, name: str, rows: np.ndarray | None = None
              ) -> np.ndarray:
    """One meta array of ``split`` (the given rows, in that order)."""
    with reading(path) as f:
        ds = f[split]["meta"][name]
        values = ds.asstr()[...] if ds.dtype == STRING_DTYPE else ds[...]
    return values if rows is None else values[np.asarray(rows, dtype=np.int64)]


def read_images(path: Path, split: str, rows: np.ndarray | None = None) -> np.ndarray:
    """Images uint8 [len(rows), C, H, W] of ``split`` (all when ``rows`` is None)."""
    with reading(path) as f:
        ds = f[split]["images"]
        if rows is None:
            return ds[...]
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            return np.empty((0, *ds.shape[1:]), dtype=np.uint8)
        if len(rows) > ds.shape[0] // 4:  # one contiguous read beats many point reads
            return ds[...][rows]
        unique, inverse = np.unique(rows, return_inverse=True)
        return ds[unique][inverse]


def class_counts(path: Path) -> dict[str, np.ndarray]:
    """Per-split label counts (length = number of classes)."""
    info = read_info(path)
    with reading(path) as f:
        return {s: np.bincount(f[s]["labels"][...], minlength=info.num_classes)
                for s in info.split_sizes}


def fold_class_counts(path: Path) -> dict[str, np.ndarray]:
    """``{split: int [folds, classes]}`` label counts per fold, for splits that have folds."""
    info = read_info(path)
    out = {}
    with reading(path) as f:
        for split, k in info.folds.items():
            labels, folds = f[split]["labels"][...], f[split]["folds"][...].astype(np.int64)
            counts = np.zeros((k, info.num_classes), dtype=np.int64)
            np.add.at(counts, (folds, labels), 1)
            out[split] = counts
    return out


def groups_by_split(path: Path) -> dict[str, set[str]]:
    """The set of groups (cases/patients) in each split."""
    info = read_info(path)
    with reading(path) as f:
        return {s: set(f[s]["groups"].asstr()[...]) for s in info.split_sizes}


def fold_leaks(path: Path) -> dict[str, dict[str, list[int]]]:
    """``{split: {group: [folds]}}`` for every group whose samples lie in more than one
    CV fold (a file written with ``allow_group_leak``): a leak across folds, as a group
    in two splits is a leak across splits."""
    info = read_info(path)
    out: dict[str, dict[str, list[int]]] = {}
    with reading(path) as f:
        for split in info.folds:
            spans: dict[str, set[int]] = {}
            for group, fold in zip(f[split]["groups"].asstr()[...],
                                   f[split]["folds"][...].tolist(), strict=True):
                spans.setdefault(group, set()).add(int(fold))
            leaking = {g: sorted(k) for g, k in sorted(spans.items()) if len(k) > 1}
            if leaking:
                out[split] = leaking
    return out
