"""What a dataset file must hold, checked when it is opened.

:func:`read_info` reads a file's attributes and split sizes (:class:`DatasetInfo`)
and refuses a file that breaks the contract (:mod:`capsmed.data.contract`) with one
line naming it. :func:`open_dataset` is the one way a capsmed reader opens a file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from capsmed.errors import CapsmedError, first_line

if TYPE_CHECKING:
    from capsmed.data.domains import Domain
    from capsmed.data.sources import Source

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
# What the reports call their total row (report.csv's ``total``, the terminal tables'
# ``Total (macro)``, capsmed report's ``Total``): a class of such a name (case and
# spaces aside) would be a second row of that name, taken for the total by a reader.
TOTAL_ROW_NAMES = frozenset({"total", "total (macro)"})


def refuse_total_row_name(names: Any, where: Path | str) -> None:
    """Refuse a class named like the reports' total row (``where``: the file or folder
    that names it)."""
    for name in names:
        if str(name).strip().casefold() in TOTAL_ROW_NAMES:
            raise CapsmedError(f"{where}: class {name!r} has the name of the reports' total "
                               "row ('total' in report.csv), so a report could not tell the "
                               "two apart; rename the class (its folder) and preprocess "
                               "again")


def class_index(names: Sequence[str], wanted: str) -> int | None:
    """Where the class a user named (``--class``, ``--imbalance``, ``--classes``) is in
    ``names``; None when it is not there. A name typed in one Unicode form matches one
    stored in the other (NFC as typed on Linux, NFD in a folder copied from macOS): they
    look the same, so refusing one with a list that seems to hold it would baffle. An
    exact match comes first; two stored names of one NFC form match neither."""
    if wanted in names:
        return list(names).index(wanted)
    key = unicodedata.normalize("NFC", wanted)
    hits = [i for i, name in enumerate(names) if unicodedata.normalize("NFC", name) == key]
    return hits[0] if len(hits) == 1 else None


# What the readers and the preprocessing make of the same raw files and options. Bumped
# by any change after which the same command writes different images or labels, so that
# `capsmed run` makes its data stages again instead of training on the older file.
#   1 (2026-11-22): torchvision roots read MNIST and Fashion-MNIST apart; TIFFs read as
#     they look (palette, MINISWHITE); AML alpha blended; folder grey/colour per file.
# Not bumped for gzip instead of LZF, dataset attributes and the provenance attribute
# (2026-11-24): the file bytes change but every array reads back identical, so a run
# trained on an older file trained on the same data; `capsmed preprocess` again gives
# a portable file when one is wanted.
#   2 (2026-11-27): TIFF samples of 2-7 bits scaled to full range; Reinhard leaves blank
#     images as they are; an RGBA stain target is composited over white. (TUPAC16's
#     faster patch cutting and look-ups write the same arrays: not a reason.)
#   3 (2026-11-27): TIFF samples of 9-15 bits scaled to full range; a grey + alpha PNG
#     read as grey (OpenCV made it colour); a TUPAC16 mitosis listed twice counted once;
#     WSI tiles narrower than a mask pixel take the pixel under them, and a last tile
#     that fits exactly is kept.
#   4 (2026-11-28): a DIARETDB1 fundus mask read as it looks (MINISWHITE inverted; an
#     opaque alpha no longer counted as field of view); Macenko orients its stain
#     vectors before it picks hematoxylin (an image whose vector was flipped got the
#     stains swapped). (Refusing translucent TUPAC16
#     and DIARETDB1 images changes no file that was written: not a reason.)
#   5 (2026-11-28): a TIFF named otherwise (.png) read by tifffile, as one named .tif
#     (OpenCV turned it by its orientation tag). (Refusing animations, stacks by
#     another name and colour-keyed DIARETDB1 PNGs changes no file written: not a reason.)
#   6 (2026-11-28): stain normalisation leaves glass (under 16 pixels above OD 0.15)
#     as it is (its noise was scaled into tissue), and Reinhard no longer scales a
#     colourless channel's rounding noise (a grey image came out coloured).
DATA_REVISION = 6
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
    source_kind: str | None = None  # the registered source that wrote it (None: older)
    domain: str | None = None  # its image domain (None: written before domains)
    provenance: dict[str, Any] = field(default_factory=dict)  # command line, versions
    data_revision: int = 0  # DATA_REVISION of the capsmed that wrote it (0: before them)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def data_source(self) -> Source:
        """The registered source that wrote the file (:mod:`capsmed.data.sources`)."""
        from capsmed.data.sources import source_of

        return source_of(self.source_kind, self.dataset, self.preprocessing, self.path)

    def image_domain(self) -> Domain:
        """The file's image domain, from which training takes its defaults."""
        from capsmed.data.sources import domain_of

        return domain_of(self.source_kind, self.domain, self.dataset, self.preprocessing,
                         self.path)


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
        raise CapsmedError(f"{path}: cannot open HDF5 file ({first_line(exc)})") from exc


@contextlib.contextmanager
def reading(path: Path) -> Iterator[h5py.File]:
    """The open file; h5py's errors on a damaged body (truncated or overwritten
    blocks: ``OSError``, ``RuntimeError``, ``KeyError``) become one line naming it."""
    path = Path(path)
    with open_dataset(path) as f:
        try:
            yield f
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise CapsmedError(f"{path}: cannot read ({first_line(exc)}); the file is "
                               "damaged or truncated: write it again") from exc



def split_names(f: h5py.File) -> list[str]:
    """The groups that are splits: those holding images or labels (a split missing one
    of them is refused by :func:`_check_split`, not passed over as if absent)."""
    return [k for k in f if isinstance(f[k], h5py.Group)
            and ("labels" in f[k] or "images" in f[k])]


def read_info(path: Path) -> DatasetInfo:
    """Read a dataset file's attributes and split sizes, and check that the file keeps
    the contract: attribute types, every split's dtypes and shapes, labels within the
    classes, folds >= 0.

    Raises:
        CapsmedError: naming the file and the first thing that is wrong.
    """
    path = Path(path)
    with reading(path) as f:
        required = ("format_version", "dataset", "class_names", "image_size", "channels")
        missing = [k for k in required if k not in f.attrs]
        if missing:
            raise CapsmedError(f"{path}: not a capsmed dataset (missing attributes "
                               f"{', '.join(missing)})")
        attrs = _Attributes(path, f.attrs)
        version = attrs.integer("format_version")
        if version > FORMAT_VERSION:
            raise CapsmedError(f"{path}: format_version {version} is newer than this capsmed "
                               f"supports ({FORMAT_VERSION}); upgrade capsmed")
        class_names = attrs.class_names()
        image_size = attrs.image_size()
        channels = attrs.integer("channels", minimum=1)
        splits = split_names(f)
        if not splits:
            raise CapsmedError(f"{path}: contains no splits (expected train/val/test groups)")
        sizes: dict[str, int] = {}
        folds: dict[str, int] = {}
        for split in splits:
            sizes[split], k = _check_split(path, f[split], split, (channels, *image_size),
                                           list(class_names))
            if k is not None:
                folds[split] = k
        return DatasetInfo(
            path=path,
            dataset=attrs.text("dataset"),
            class_names=class_names,
            image_size=image_size,
            channels=channels,
            preprocessing=attrs.mapping("preprocessing"),
            source=attrs.mapping("source"),
            split_sizes=sizes,
            capsmed_version=attrs.shown("capsmed_version"),
            created=attrs.shown("created"),
            format_version=version,
            folds=folds,
            source_kind=attrs.optional_text("source_kind"),
            domain=attrs.optional_text("domain"),
            provenance=attrs.mapping("provenance"),
            data_revision=(attrs.integer("data_revision", minimum=1)
                           if "data_revision" in f.attrs else 0),
        )


def warn_if_older_revision(info: DatasetInfo, doing: str) -> None:
    """Warn that ``info``'s file was written by a capsmed whose preprocessing made other
    images or labels of some raw files than this one makes (:data:`DATA_REVISION`)."""
    if info.data_revision < DATA_REVISION:
        log.warning("%s: written by capsmed's data revision %d; this capsmed's is %d, "
                    "whose preprocessing makes other images or labels of some raw files "
                    "(capsmed/data/schema.py says which); %s it as it is, or preprocess "
                    "again for the current data", info.path, info.data_revision,
                    DATA_REVISION, doing)


class _Attributes:
    """Typed reads of the file attributes, each failing with a line naming the file."""

    def __init__(self, path: Path, attrs: h5py.AttributeManager) -> None:
        self.path, self.attrs = path, attrs

    def _bad(self, name: str, expected: str) -> CapsmedError:
        value = self.attrs[name]
        shown = value.decode(errors="replace") if isinstance(value, bytes) else value
        return CapsmedError(f"{self.path}: attribute '{name}' must be {expected}, got "
                            f"{str(shown)[:60]!r}")

    def shown(self, name: str) -> str:
        """A descriptive attribute as text, "?" when absent: fixed-length strings (as C,
        MATLAB and h5py's ``np.bytes_`` write them) decoded, not shown as ``b'...'``."""
        if name not in self.attrs:
            return "?"
        value = self.attrs[name]
        return value.decode("utf-8", errors="replace") if isinstance(value, bytes) \
            else str(value)

    def optional_text(self, name: str) -> str | None:
        return self.text(name) if name in self.attrs else None

    def text(self, name: str) -> str:
        value = self.attrs[name]
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        if not isinstance(value, str):
            raise self._bad(name, "a string")
        return value

    def integer(self, name: str, minimum: int | None = None) -> int:
        value = self.attrs[name]
        if isinstance(value, np.ndarray) and value.shape == ():
            value = value[()]
        if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer) \
                or (minimum is not None and value < minimum):
            raise self._bad(name, "an integer" + (f" >= {minimum}" if minimum else ""))
        return int(value)

    def json(self, name: str, expected: str) -> Any:
        try:
            return json.loads(self.text(name))
        except ValueError:
            raise self._bad(name, f"JSON of {expected}") from None

    def class_names(self) -> tuple[str, ...]:
        expected = "a list of distinct class names"
        names = self.json("class_names", expected)
        if not isinstance(names, list) or not names or len(set(map(str, names))) != len(
                names) or not all(isinstance(n, str) and n for n in names):
            raise self._bad("class_names", f"JSON of {expected}")
        return tuple(names)

    def image_size(self) -> tuple[int, int]:
        size = self.json("image_size", "[height, width]")
        if not (isinstance(size, list) and len(size) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                        for v in size)):
            raise self._bad("image_size", "JSON of [height, width], two positive integers")
        return int(size[0]), int(size[1])

    def mapping(self, name: str) -> dict[str, Any]:
        if name not in self.attrs:
            return {}
        value = self.json(name, "an object")
        if not isinstance(value, dict):
            raise self._bad(name, "JSON of an object")
        return value


def _split_names(value: Any) -> list[str] | None:
    """A split's own ``class_names`` attribute (JSON text) as a list; None if unreadable."""
    try:
        names = json.loads(value.decode() if isinstance(value, bytes) else str(value))
    except ValueError:
        return None
    return [str(n) for n in names] if isinstance(names, list) else None


def _check_image_attrs(path: Path, split: str, attrs: h5py.AttributeManager) -> None:
    """Refuse images whose own ``axes`` or ``value_range`` attribute (as another tool may
    write them) says other than the N,C,H,W uint8 0..255 every reader takes them for."""
    def text(value: Any) -> str:
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

    if "axes" in attrs and text(attrs["axes"]).replace(" ", "").upper() != "N,C,H,W":
        raise CapsmedError(f"{path}: '{split}/images' has axes {text(attrs['axes'])!r}, "
                           "expected 'N,C,H,W' (channels first)")
    if "value_range" in attrs:
        value = attrs["value_range"]
        try:
            bounds = json.loads(value) if isinstance(value, str | bytes) \
                else np.asarray(value).tolist()
        except ValueError:
            bounds = text(value)
        if bounds != [0, 255]:
            raise CapsmedError(f"{path}: '{split}/images' has value_range {bounds}, "
                               "expected [0, 255] (uint8 images are read as 0..255)")


def _check_split(path: Path, grp: h5py.Group, split: str, image_shape: tuple[int, ...],
                 names: list[str]) -> tuple[int, int | None]:
    """A split's size and number of folds (None without folds), after checking its
    datasets' types, shapes and values (and its labels' class names against the
    file's, where the split repeats them)."""
    num_classes = len(names)
    for key in ("images", "labels", "groups"):
        if key not in grp or not isinstance(grp[key], h5py.Dataset):
            raise CapsmedError(f"{path}: split '{split}' has no '{key}' dataset")
    images, labels, groups = grp["images"], grp["labels"], grp["groups"]
    if images.dtype != np.uint8 or images.shape[1:] != image_shape:
        raise CapsmedError(f"{path}: '{split}/images' is {images.dtype} {list(images.shape)}, "
                           f"expected uint8 [N, {', '.join(map(str, image_shape))}] (the "
                           "channels and image_size attributes)")
    _check_image_attrs(path, split, images.attrs)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise CapsmedError(f"{path}: '{split}/labels' is {labels.dtype} "
                           f"{list(labels.shape)}, expected integers [N]")
    if groups.ndim != 1 or h5py.check_string_dtype(groups.dtype) is None:
        raise CapsmedError(f"{path}: '{split}/groups' is {groups.dtype} "
                           f"{list(groups.shape)}, expected strings [N]")
    n = labels.shape[0]
    if images.shape[0] != n or groups.shape[0] != n:
        raise CapsmedError(f"{path}: split '{split}' has mismatched lengths "
                           f"(images {images.shape[0]}, labels {n}, groups {groups.shape[0]})")
    if "class_names" in labels.attrs and _split_names(labels.attrs["class_names"]) != names:
        raise CapsmedError(f"{path}: '{split}/labels' names its classes "
                           f"{_split_names(labels.attrs['class_names'])}, the file "
                           f"{list(names)}: a reader of either would label the images "
                           "differently")
    values = labels[...]
    outside = values[(values < 0) | (values >= num_classes)]
    if len(outside):
        raise CapsmedError(f"{path}: '{split}/labels' holds {len(outside)} label(s) outside "
                           f"0..{num_classes - 1} (e.g. {int(outside[0])}); class_names "
                           f"has {num_classes} classes")
    meta = grp.get("meta")
    if isinstance(meta, h5py.Group):  # per-sample arrays: row i belongs to image i
        for name, ds in meta.items():
            if isinstance(ds, h5py.Dataset) and (ds.ndim == 0 or ds.shape[0] != n):
                raise CapsmedError(f"{path}: '{split}/meta/{name}' has "
                                   f"{ds.shape[0] if ds.ndim else 'no'} rows for {n} "
                                   "samples")
    if "folds" not in grp:
        return n, None
    folds = grp["folds"]
    if folds.ndim != 1 or folds.dtype.kind not in "iu" or folds.shape[0] != n:
        raise CapsmedError(f"{path}: '{split}/folds' is {folds.dtype} {list(folds.shape)}, "
                           f"expected {n} integers")
    fold_values = folds[...]
    if n and fold_values.min() < 0:
        raise CapsmedError(f"{path}: '{split}/folds' holds negative folds")
    return n, int(fold_values.max()) + 1 if n else 0
