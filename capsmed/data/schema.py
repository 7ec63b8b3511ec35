"""What a dataset file must hold, checked when it is opened.

:func:`read_info` reads a file's attributes and split sizes (:class:`DatasetInfo`)
and refuses a file that breaks the contract (:mod:`capsmed.data.contract`) with one
line naming it. :func:`open_dataset` is the one way a capsmed reader opens a file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from capsmed.errors import CapsmedError

FORMAT_VERSION = 1
STRING_DTYPE = h5py.string_dtype(encoding="utf-8")


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset file says about itself (its attributes and split sizes)."""

    path: Path
    dataset: str
    class_names: tuple[str, ...]
    image_size: tuple[int, int]
    channels: int
    preprocessing: dict[str, Any]
    source: dict[str, Any]
    split_sizes: dict[str, int]
    capsmed_version: str
    created: str
    format_version: int
    folds: dict[str, int] = field(default_factory=dict)  # split -> number of folds

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


@dataclass(frozen=True)
class SplitData:
    """One split held in memory: images uint8 [N, C, H, W], labels int64 [N], groups [N]."""

    images: np.ndarray
    labels: np.ndarray
    groups: np.ndarray
    meta: dict[str, np.ndarray] = field(default_factory=dict)
    folds: np.ndarray | None = None  # int8 [N] when the split carries CV folds

    def __len__(self) -> int:
        return len(self.labels)


def open_dataset(path: Path) -> h5py.File:
    """Open a dataset file for reading, or fail with one line naming it."""
    path = Path(path)
    if not path.exists():
        raise CapsmedError(f"{path}: no such file")
    if path.is_dir():
        raise CapsmedError(f"{path}: is a folder, expected a capsmed .h5 dataset file")
    if not h5py.is_hdf5(path):
        raise CapsmedError(f"{path}: not an HDF5 file (expected a dataset written by "
                           "`capsmed preprocess`)")
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise CapsmedError(f"{path}: cannot open HDF5 file ({exc})") from exc


def split_names(f: h5py.File) -> list[str]:
    return [k for k in f if isinstance(f[k], h5py.Group) and "labels" in f[k]]


def read_info(path: Path) -> DatasetInfo:
    """Read and validate a dataset file's attributes and split sizes."""
    path = Path(path)
    with open_dataset(path) as f:
        required = ("format_version", "dataset", "class_names", "image_size", "channels")
        missing = [k for k in required if k not in f.attrs]
        if missing:
            raise CapsmedError(f"{path}: not a capsmed dataset (missing attributes "
                               f"{', '.join(missing)})")
        version = int(f.attrs["format_version"])
        if version > FORMAT_VERSION:
            raise CapsmedError(f"{path}: format_version {version} is newer than this capsmed "
                               f"supports ({FORMAT_VERSION}); upgrade capsmed")
        splits = split_names(f)
        if not splits:
            raise CapsmedError(f"{path}: contains no splits (expected train/val/test groups)")
        sizes: dict[str, int] = {}
        folds: dict[str, int] = {}
        for split in splits:
            grp = f[split]
            for key in ("images", "labels", "groups"):
                if key not in grp:
                    raise CapsmedError(f"{path}: split '{split}' has no '{key}' dataset")
            n = grp["labels"].shape[0]
            if grp["images"].shape[0] != n or grp["groups"].shape[0] != n:
                raise CapsmedError(f"{path}: split '{split}' has mismatched lengths "
                                   f"(images {grp['images'].shape[0]}, labels {n}, "
                                   f"groups {grp['groups'].shape[0]})")
            sizes[split] = n
            if "folds" in grp:
                if grp["folds"].shape[0] != n:
                    raise CapsmedError(f"{path}: split '{split}' has {grp['folds'].shape[0]} "
                                       f"folds for {n} samples")
                folds[split] = int(grp["folds"][...].max()) + 1 if n else 0
        h, w = json.loads(f.attrs["image_size"])
        return DatasetInfo(
            path=path,
            dataset=str(f.attrs["dataset"]),
            class_names=tuple(json.loads(f.attrs["class_names"])),
            image_size=(int(h), int(w)),
            channels=int(f.attrs["channels"]),
            preprocessing=json.loads(f.attrs.get("preprocessing", "{}")),
            source=json.loads(f.attrs.get("source", "{}")),
            split_sizes=sizes,
            capsmed_version=str(f.attrs.get("capsmed_version", "?")),
            created=str(f.attrs.get("created", "?")),
            format_version=version,
            folds=folds,
        )


