"""The one writer of dataset files: :class:`DatasetWriter` streams samples into a
temporary file beside the target, refuses a group that appears in two splits (or
spans two folds), and renames the file into place only when everything succeeded.

Files are portable: images and N-D meta arrays are compressed with gzip (deflate), a
filter built into every HDF5 library, so h5dump, MATLAB, R's rhdf5 and HDF5.jl read
them as h5py does (LZF, used before, is h5py's own filter: only h5py could; files
written with it are still read). Every dataset says what its axes and values are, and
the file records how it was made (:func:`provenance`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import platform
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import h5py
import numpy as np

from capsmed import __version__
from capsmed.data.domains import get_domain
from capsmed.data.schema import (
    DATA_REVISION,
    FORMAT_VERSION,
    STRING_DTYPE,
    refuse_total_row_name,
)
from capsmed.errors import CapsmedError
from capsmed.io import atomic_path

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20  # ~1 MiB image chunks: 1,337 images at 28x28, 21 at 128x128x3
# gzip level 4 (python -m benchmarks.hdf5_compression, 2 cores): files 20-26 % smaller
# than LZF's on hematoxylin patches, photo tiles and digits, read as fast (~190-270
# MiB/s), written at 37-62 MiB/s (LZF 63-121); level 1 is 2-5 % larger, 6 and 9 write
# 2-15x slower for 1-3 % less.
COMPRESSION = {"compression": "gzip", "compression_opts": 4}
# the distributions whose versions a file records (absent ones are left out)
LIBRARIES = ("capsmed", "numpy", "h5py", "scikit-image", "opencv-python-headless",
             "opencv-python", "tifffile", "imagecodecs", "pillow", "openslide-python",
             "openslide-bin", "scipy", "scikit-learn")


def library_versions() -> dict[str, str]:
    """Versions of the libraries that read and wrote the data, and of HDF5 and Python."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    found["hdf5"] = h5py.version.hdf5_version
    found["python"] = platform.python_version()
    return found


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that made the file, as typed (``capsmed preprocess ...``); from a
    script or a test, that program's command line."""
    argv = list(sys.argv if argv is None else argv)
    program = Path(argv[0]).name if argv else ""
    if program == "capsmed" or (program == "__main__.py" and Path(argv[0]).parent.name
                                == "capsmed"):
        argv = ["capsmed", *argv[1:]]
    return shlex.join(argv)


def provenance() -> dict[str, Any]:
    """How a file was made: the command line and the library versions (the inputs'
    digests, where a source takes them, are in its ``source`` attribute)."""
    return {"command_line": command_line(), "versions": library_versions(),
            "platform": platform.platform()}


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
        kind: The registered source writing it (:mod:`capsmed.data.sources`).
        domain: Its image domain (:mod:`capsmed.data.domains`): training defaults.
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
        kind: str,
        domain: str,
        class_names: Sequence[str],
        image_shape: tuple[int, int, int],
        preprocessing: Mapping[str, Any],
        source: Mapping[str, Any],
        allow_group_leak: bool = False,
    ) -> None:
        self.path = Path(path)
        self.dataset = dataset
        self.kind, self.domain = kind, get_domain(domain).name
        self.class_names = list(class_names)
        refuse_total_row_name(self.class_names, self.path)  # a source names the input first
        self.image_shape = tuple(int(v) for v in image_shape)
        self.preprocessing = dict(preprocessing)
        self.source = dict(source)
        self.allow_group_leak = allow_group_leak
        self._groups: dict[str, set[str]] = {}
        self._group_folds: dict[str, dict[str, set[int]]] = {}  # split -> group -> folds
        self._sizes: dict[str, int] = {}
        self._atomic = atomic_path(self.path)
        self._file: h5py.File | None = None
        self._open: dict[str, h5py.Dataset] = {}  # datasets written to, kept open

    def __enter__(self) -> DatasetWriter:
        tmp = self._atomic.__enter__()
        # a chunk cache that holds each open dataset's partial chunk (1 MiB chunks)
        self._file = h5py.File(tmp, "w", rdcc_nbytes=4 << 20)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._file is not None
        try:
            if exc is None:
                self._finalise()
        except BaseException as err:  # a failed finalise must still remove the temp file
            self._open.clear()
            self._file.close()
            self._atomic.__exit__(type(err), err, err.__traceback__)
            raise
        self._open.clear()
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
        for name, values in [*arrays, *((f"meta/{k}", v) for k, v in (meta or {}).items())]:
            values = np.asarray(values)
            if values.dtype.kind in "UO":
                values = values.astype(object)
            ds = self._dataset(grp, name)
            ds.resize(start + n, axis=0)
            ds[start:] = values

    def _dataset(self, grp: h5py.Group, name: str) -> h5py.Dataset:
        """``grp[name]``, kept open: closing a compressed dataset after each batch wrote
        its last, partial chunk compressed, and the next batch read it back and
        compressed it again (a third of TUPAC16's preprocessing time)."""
        key = f"{grp.name}/{name}"
        if key not in self._open:
            self._open[key] = grp[name]
        return self._open[key]

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
        images = grp.create_dataset("images", shape=(0, c, h, w), maxshape=(None, c, h, w),
                                    dtype=np.uint8, chunks=(per_chunk, c, h, w),
                                    **COMPRESSION)
        images.attrs.update(axes="N,C,H,W", value_range=np.array([0, 255], np.uint8),
                            description="uint8 pixel values (0 = black), channel first")
        labels = grp.create_dataset("labels", shape=(0,), maxshape=(None,), dtype=np.int64,
                                    chunks=(4096,))
        labels.attrs.update(axes="N", class_names=json.dumps(self.class_names),
                            description="class index of each image (0-based, into "
                            "class_names)")
        groups = grp.create_dataset("groups", shape=(0,), maxshape=(None,),
                                    dtype=STRING_DTYPE, chunks=(4096,))
        groups.attrs.update(axes="N", description="the patient, case, slide or image "
                            "each sample came from; no group is in two splits")
        if with_folds:
            folds = grp.create_dataset("folds", shape=(0,), maxshape=(None,), dtype=np.int8,
                                       chunks=(4096,))
            folds.attrs.update(axes="N", description="cross-validation fold (0-based) of "
                               "each sample; no group spans two folds")
        meta_grp = grp.create_group("meta")
        for name, values in meta.items():
            values = np.asarray(values)
            dtype = STRING_DTYPE if values.dtype.kind in "UO" else values.dtype
            tail = values.shape[1:]
            rows = max(1, CHUNK_BYTES // max(1, int(np.prod(tail)) * dtype.itemsize)) \
                if tail and dtype != STRING_DTYPE else 4096
            ds = meta_grp.create_dataset(name, shape=(0, *tail), maxshape=(None, *tail),
                                         dtype=dtype, chunks=(min(rows, 4096), *tail),
                                         **(COMPRESSION if tail else {}))
            if not tail or (len(tail) == 3 and dtype == np.uint8):  # per-sample images
                ds.attrs["axes"] = "N,C,H,W" if tail else "N"
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
        attrs["source_kind"] = self.kind
        attrs["domain"] = self.domain
        attrs["class_names"] = json.dumps(self.class_names)
        attrs["image_size"] = json.dumps([h, w])
        attrs["channels"] = c
        attrs["preprocessing"] = json.dumps(self.preprocessing, sort_keys=True)
        attrs["source"] = json.dumps(self.source, sort_keys=True)
        attrs["capsmed_version"] = __version__
        attrs["provenance"] = json.dumps(provenance(), sort_keys=True)
        attrs["data_revision"] = DATA_REVISION
        attrs["created"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        attrs["group_leak_allowed"] = bool(leaks)
        log.info("wrote %s: %s", self.path,
                 ", ".join(f"{s}={n}" for s, n in self._sizes.items()))
