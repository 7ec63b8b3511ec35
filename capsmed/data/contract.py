"""The HDF5 dataset contract (SPEC section 3): one file per preprocessed dataset.

Layout::

    /<split>/images   uint8 [N, C, H, W], chunked, lzf-compressed
    /<split>/labels   int64 [N]
    /<split>/groups   str   [N]   case / patient / slide id each sample came from
    /<split>/meta/*   optional per-sample arrays, 1-D or N-D (source file, row, col,
                      a second label, source images, ...)
    /<split>/folds    optional int8 [N]: cross-validation fold of each sample (usually
                      in a split named ``all``); groups never span two folds
    file attrs: format_version, dataset, class_names (JSON), image_size, channels,
                preprocessing (JSON), source (JSON), capsmed_version, created (UTC)

:class:`DatasetWriter` is the only writer: it streams samples into a temporary file
beside the target, refuses a group that appears in two splits, and renames the file
into place only when everything succeeded. :func:`read_info` and :func:`load_split`
validate the schema and fail with one line naming the file.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import h5py
import numpy as np

from capsmed import __version__
from capsmed.errors import CapsmedError
from capsmed.io import atomic_path

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
CHUNK_BYTES = 1 << 20  # ~1 MiB image chunks: 1,337 images at 28x28, 21 at 128x128x3
_STR = h5py.string_dtype(encoding="utf-8")


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


def find_leaks(groups_by_split: Mapping[str, set[str]]) -> dict[str, list[str]]:
    """Return ``{group: [splits...]}`` for every group present in more than one split."""
    seen: dict[str, list[str]] = {}
    for split, groups in groups_by_split.items():
        for group in groups:
            seen.setdefault(group, []).append(split)
    return {g: sorted(s) for g, s in sorted(seen.items()) if len(s) > 1}


def _leak_message(path: Path, leaks: dict[str, list[str]]) -> str:
    shown = ", ".join(f"{g} in {'+'.join(s)}" for g, s in list(leaks.items())[:5])
    more = f" (and {len(leaks) - 5} more)" if len(leaks) > 5 else ""
    return (f"{path}: {len(leaks)} group(s) appear in more than one split ({shown}{more}); "
            "split by group, or pass allow_group_leak=True / --allow-group-leak to override")


class DatasetWriter:
    """Stream samples into a contract-conforming HDF5 file, written atomically.

    Use as a context manager; the file appears under ``path`` only if the block
    finishes without an exception and the split is leak-free.

    Args:
        path: Final ``.h5`` path.
        dataset: Dataset name, e.g. ``"tupac16"``.
        class_names: Class names, index = label.
        image_shape: ``(C, H, W)`` of every image.
        preprocessing: Every parameter used to produce the images (JSON-serialisable).
        source: Where the raw data came from (path, file sizes or hashes).
        allow_group_leak: Write even if a group appears in two splits (recorded).
    """

    def __init__(
        self,
        path: Path,
        *,
        dataset: str,
        class_names: Sequence[str],
        image_shape: tuple[int, int, int],
        preprocessing: Mapping[str, Any],
        source: Mapping[str, Any],
        allow_group_leak: bool = False,
    ) -> None:
        self.path = Path(path)
        self.dataset = dataset
        self.class_names = list(class_names)
        self.image_shape = tuple(int(v) for v in image_shape)
        self.preprocessing = dict(preprocessing)
        self.source = dict(source)
        self.allow_group_leak = allow_group_leak
        self._groups: dict[str, set[str]] = {}
        self._group_folds: dict[str, dict[str, set[int]]] = {}  # split -> group -> folds
        self._sizes: dict[str, int] = {}
        self._atomic = atomic_path(self.path)
        self._file: h5py.File | None = None

    def __enter__(self) -> DatasetWriter:
        tmp = self._atomic.__enter__()
        self._file = h5py.File(tmp, "w")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._file is not None
        try:
            if exc is None:
                self._finalise()
        except BaseException as err:  # a failed finalise must still remove the temp file
            self._file.close()
            self._atomic.__exit__(type(err), err, err.__traceback__)
            raise
        self._file.close()
        self._atomic.__exit__(exc_type, exc, tb)

    def update_preprocessing(self, **values: Any) -> None:
        """Record parameters only known after reading the data (e.g. source image sizes);
        written with the other attributes when the file is finalised."""
        self.preprocessing.update(values)

    def append(self, split: str, images: np.ndarray, labels: np.ndarray,
               groups: Sequence[str], meta: Mapping[str, np.ndarray] | None = None,
               folds: np.ndarray | None = None) -> None:
        """Append a batch of samples to ``split``.

        ``meta`` arrays have the batch length as first axis (any trailing shape);
        ``folds`` gives each sample's cross-validation fold (0..k-1) and must be given
        for every batch of a split or for none.

        Raises:
            CapsmedError: on a shape/dtype mismatch or (unless allowed) a group leak.
        """
        assert self._file is not None, "use DatasetWriter as a context manager"
        images = np.asarray(images)
        labels = np.asarray(labels, dtype=np.int64)
        n = len(labels)
        if images.dtype != np.uint8 or images.shape[1:] != self.image_shape or len(images) != n:
            raise CapsmedError(f"{self.path}: batch for '{split}' has images {images.dtype} "
                               f"{images.shape}, expected uint8 [{n}, {self.image_shape}]")
        if len(groups) != n:
            raise CapsmedError(f"{self.path}: {len(groups)} groups for {n} samples in '{split}'")
        if n and (labels.min() < 0 or labels.max() >= len(self.class_names)):
            raise CapsmedError(f"{self.path}: label out of range 0..{len(self.class_names) - 1}")
        new_groups = {str(g) for g in groups}
        if not self.allow_group_leak:
            # only the new groups against the other splits: linear in the batch, so
            # one-group-per-image sets (MNIST) do not pay a full check per append
            clash = {g: sorted([split, s]) for s, gs in self._groups.items() if s != split
                     for g in new_groups & gs}
            if clash:
                raise CapsmedError(_leak_message(self.path, dict(sorted(clash.items()))))
        if n == 0:  # nothing to store; empty arrays would also carry meaningless dtypes
            return
        arrays = [("images", images), ("labels", labels),
                  ("groups", np.asarray([str(g) for g in groups], dtype=object))]
        if folds is not None:
            folds = np.asarray(folds)
            if folds.shape != (n,) or folds.min() < 0 or folds.max() > 127:
                raise CapsmedError(f"{self.path}: folds for '{split}' must be {n} integers "
                                   "in 0..127")
            arrays.append(("folds", folds.astype(np.int8)))
            per_group = self._group_folds.setdefault(split, {})
            for g, k in zip(groups, folds.tolist(), strict=True):
                per_group.setdefault(str(g), set()).add(int(k))
        for name, values in (meta or {}).items():
            if len(values) != n:
                raise CapsmedError(f"{self.path}: meta '{name}' has {len(values)} rows for "
                                   f"{n} samples in '{split}'")
        self._groups.setdefault(split, set()).update(new_groups)
        grp = self._ensure_split(split, meta or {}, with_folds=folds is not None)
        start = self._sizes[split]
        self._sizes[split] = start + n
        for name, values in arrays:
            grp[name].resize(start + n, axis=0)
            grp[name][start:] = values
        for name, values in (meta or {}).items():
            values = np.asarray(values)
            if values.dtype.kind in "UO":
                values = values.astype(object)
            ds = grp["meta"][name]
            ds.resize(start + n, axis=0)
            ds[start:] = values

    def _ensure_split(self, split: str, meta: Mapping[str, np.ndarray],
                      with_folds: bool) -> h5py.Group:
        assert self._file is not None
        if split in self._file:
            grp = self._file[split]
            mismatch = set(grp["meta"].keys()) ^ set(meta.keys())
            if mismatch:
                raise CapsmedError(f"{self.path}: inconsistent meta fields in '{split}': "
                                   f"{sorted(mismatch)}")
            if ("folds" in grp) != with_folds:
                raise CapsmedError(f"{self.path}: folds given for some batches of '{split}' "
                                   "but not others")
            return grp
        grp = self._file.create_group(split)
        c, h, w = self.image_shape
        per_chunk = max(1, CHUNK_BYTES // (c * h * w))
        grp.create_dataset("images", shape=(0, c, h, w), maxshape=(None, c, h, w),
                           dtype=np.uint8, chunks=(per_chunk, c, h, w), compression="lzf")
        grp.create_dataset("labels", shape=(0,), maxshape=(None,), dtype=np.int64,
                           chunks=(4096,))
        grp.create_dataset("groups", shape=(0,), maxshape=(None,), dtype=_STR, chunks=(4096,))
        if with_folds:
            grp.create_dataset("folds", shape=(0,), maxshape=(None,), dtype=np.int8,
                               chunks=(4096,))
        meta_grp = grp.create_group("meta")
        for name, values in meta.items():
            values = np.asarray(values)
            dtype = _STR if values.dtype.kind in "UO" else values.dtype
            tail = values.shape[1:]
            rows = max(1, CHUNK_BYTES // max(1, int(np.prod(tail)) * dtype.itemsize)) \
                if tail and dtype != _STR else 4096
            meta_grp.create_dataset(name, shape=(0, *tail), maxshape=(None, *tail),
                                    dtype=dtype, chunks=(min(rows, 4096), *tail),
                                    compression="lzf" if tail else None)
        self._sizes[split] = 0
        return grp

    def _finalise(self) -> None:
        assert self._file is not None
        if not self._sizes or sum(self._sizes.values()) == 0:
            raise CapsmedError(f"{self.path}: no samples were produced; nothing written")
        leaks = find_leaks(self._groups)
        if leaks and not self.allow_group_leak:
            raise CapsmedError(_leak_message(self.path, leaks))
        for split, per_group in self._group_folds.items():
            spanning = sorted(g for g, k in per_group.items() if len(k) > 1)
            if spanning and not self.allow_group_leak:
                raise CapsmedError(f"{self.path}: {len(spanning)} group(s) of '{split}' span "
                                   f"two folds (e.g. {spanning[0]}); assign folds by group")
            leaks = leaks or dict.fromkeys(spanning, [split])
        c, h, w = self.image_shape
        attrs = self._file.attrs
        attrs["format_version"] = FORMAT_VERSION
        attrs["dataset"] = self.dataset
        attrs["class_names"] = json.dumps(self.class_names)
        attrs["image_size"] = json.dumps([h, w])
        attrs["channels"] = c
        attrs["preprocessing"] = json.dumps(self.preprocessing, sort_keys=True)
        attrs["source"] = json.dumps(self.source, sort_keys=True)
        attrs["capsmed_version"] = __version__
        attrs["created"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        attrs["group_leak_allowed"] = bool(leaks)
        log.info("wrote %s: %s", self.path,
                 ", ".join(f"{s}={n}" for s, n in self._sizes.items()))


def _open(path: Path) -> h5py.File:
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


def _split_names(f: h5py.File) -> list[str]:
    return [k for k in f if isinstance(f[k], h5py.Group) and "labels" in f[k]]


def read_info(path: Path) -> DatasetInfo:
    """Read and validate a dataset file's attributes and split sizes."""
    path = Path(path)
    with _open(path) as f:
        required = ("format_version", "dataset", "class_names", "image_size", "channels")
        missing = [k for k in required if k not in f.attrs]
        if missing:
            raise CapsmedError(f"{path}: not a capsmed dataset (missing attributes "
                               f"{', '.join(missing)})")
        version = int(f.attrs["format_version"])
        if version > FORMAT_VERSION:
            raise CapsmedError(f"{path}: format_version {version} is newer than this capsmed "
                               f"supports ({FORMAT_VERSION}); upgrade capsmed")
        splits = _split_names(f)
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


def load_split(path: Path, split: str, *, with_meta: bool = False) -> SplitData:
    """Load one split fully into memory (the 28-128 px sets fit easily)."""
    info = read_info(path)
    if split not in info.split_sizes:
        raise CapsmedError(f"{path}: has no '{split}' split (has: "
                           f"{', '.join(info.split_sizes)})")
    with _open(path) as f:
        grp = f[split]
        images = grp["images"][...]
        labels = grp["labels"][...].astype(np.int64)
        groups = grp["groups"].asstr()[...]
        folds = grp["folds"][...] if "folds" in grp else None
        meta = {}
        if with_meta and "meta" in grp:
            for name, ds in grp["meta"].items():
                meta[name] = ds.asstr()[...] if ds.dtype == _STR else ds[...]
    expected = (info.channels, *info.image_size)
    if images.ndim != 4 or images.shape[1:] != expected or images.dtype != np.uint8:
        raise CapsmedError(f"{path}: '{split}/images' is {images.dtype} {images.shape}, "
                           f"expected uint8 [N, {', '.join(map(str, expected))}]")
    if len(labels) and (labels.min() < 0 or labels.max() >= info.num_classes):
        raise CapsmedError(f"{path}: '{split}/labels' outside 0..{info.num_classes - 1}")
    return SplitData(images=images, labels=labels, groups=groups, meta=meta, folds=folds)


def read_labels(path: Path, split: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Labels int64 [N] and folds int8 [N] (None without folds) of ``split``, no images."""
    info = read_info(path)
    if split not in info.split_sizes:
        raise CapsmedError(f"{path}: has no '{split}' split (has: "
                           f"{', '.join(info.split_sizes)})")
    with _open(path) as f:
        grp = f[split]
        return (grp["labels"][...].astype(np.int64),
                grp["folds"][...] if "folds" in grp else None)


def meta_names(path: Path, split: str) -> list[str]:
    """Names of the per-sample meta arrays of ``split``."""
    with _open(path) as f:
        grp = f[split]
        return sorted(grp["meta"].keys()) if "meta" in grp else []


def read_meta(path: Path, split: str, name: str, rows: np.ndarray | None = None
              ) -> np.ndarray:
    """One meta array of ``split`` (the given rows, in that order)."""
    with _open(path) as f:
        ds = f[split]["meta"][name]
        values = ds.asstr()[...] if ds.dtype == _STR else ds[...]
    return values if rows is None else values[np.asarray(rows, dtype=np.int64)]


def read_images(path: Path, split: str, rows: np.ndarray | None = None) -> np.ndarray:
    """Images uint8 [len(rows), C, H, W] of ``split`` (all when ``rows`` is None)."""
    with _open(path) as f:
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
    with _open(path) as f:
        return {s: np.bincount(f[s]["labels"][...], minlength=info.num_classes)
                for s in info.split_sizes}


def fold_class_counts(path: Path) -> dict[str, np.ndarray]:
    """``{split: int [folds, classes]}`` label counts per fold, for splits that have folds."""
    info = read_info(path)
    out = {}
    with _open(path) as f:
        for split, k in info.folds.items():
            labels, folds = f[split]["labels"][...], f[split]["folds"][...].astype(np.int64)
            counts = np.zeros((k, info.num_classes), dtype=np.int64)
            np.add.at(counts, (folds, labels), 1)
            out[split] = counts
    return out


def groups_by_split(path: Path) -> dict[str, set[str]]:
    """The set of groups (cases/patients) in each split."""
    info = read_info(path)
    with _open(path) as f:
        return {s: set(f[s]["groups"].asstr()[...]) for s in info.split_sizes}
