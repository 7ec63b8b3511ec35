"""A published MedMNIST .npz file -> HDF5 contract, official splits kept.

The file (``<set>.npz``, or ``<set>_64|128|224.npz`` for MedMNIST+) holds six arrays:
``{train,val,test}_images`` uint8 [N, H, W] (grey) or [N, H, W, 3] (RGB) and
``{train,val,test}_labels`` integers [N, 1]. Which set it is comes from the file name
(or ``--set``); its class names, channels and task from the published table
(``sets.py``). Every array is checked against that table before anything is written.

MedMNIST publishes no patient ids, so every image is its own group (``train-000123``
= image 123 of the training arrays): the official splits are kept as they are, and
whether two images of one split come from the patient of another cannot be checked.
The file records that (``grouping``).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from capsmed.data.contract import DatasetWriter
from capsmed.data.fetch import file_md5
from capsmed.data.output import claims_output
from capsmed.data.sources.medmnist import SOURCE
from capsmed.data.sources.medmnist.config import MedmnistConfig
from capsmed.data.sources.medmnist.npz import Member, NpzArchive
from capsmed.data.sources.medmnist.sets import (
    MULTI_LABEL,
    ORDINAL,
    RECORD,
    SETS,
    SETS_3D,
    SIZES,
    MedmnistSet,
)
from capsmed.errors import CapsmedError

if TYPE_CHECKING:
    from capsmed.data.fetch import RemoteDataset

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
_NAME = re.compile(r"([a-z0-9]+?)(?:_(\d+))?")


def identify(path: Path, cfg: MedmnistConfig) -> tuple[MedmnistSet, int | None]:
    """The set ``path`` holds and the size its name announces (None: not named).

    Raises:
        CapsmedError: the set cannot be told, is 3-D, multi-label, or ordinal without
            ``ordinal_as_classes`` (or not ordinal with it); or the name and
            ``set_name`` disagree.
    """
    match = _NAME.fullmatch(path.stem.lower())
    named = match.group(1) if match and (match.group(1) in SETS or
                                         match.group(1) in SETS_3D) else None
    size = int(match.group(2)) if named and match.group(2) else (28 if named else None)
    if cfg.set_name and named and named != cfg.set_name:
        raise CapsmedError(f"{path}: the file name says {named}, but --set says "
                           f"{cfg.set_name}; rename the file or drop --set")
    flag = cfg.set_name or named
    if flag is None:
        raise CapsmedError(f"{path}: cannot tell which MedMNIST set this is; name it as "
                           "published (<set>.npz, <set>_64.npz, ...) or pass --set (2D "
                           f"sets: {', '.join(SETS)})")
    if flag in SETS_3D:
        raise CapsmedError(f"{path}: {flag} is a 3D set (28x28x28 volumes); capsmed "
                           "trains on 2D images")
    chosen = SETS[flag]
    if chosen.task == MULTI_LABEL:
        raise CapsmedError(f"{path}: {flag} is multi-label ({len(chosen.classes)} "
                           "findings per image); capsmed trains single-label classifiers")
    if cfg.ordinal_as_classes and chosen.task != ORDINAL:  # else recorded as false
        ordinal = ", ".join(f for f, s in SETS.items() if s.task == ORDINAL)
        raise CapsmedError(f"{path}: --ordinal-as-classes applies to ordinal sets "
                           f"({ordinal}); {flag} has no ordinal grades; drop the flag")
    if chosen.task == ORDINAL and not cfg.ordinal_as_classes:
        raise CapsmedError(f"{path}: {flag} grades are ordinal (0-4); pass "
                           "--ordinal-as-classes to train them as 5 classes, as the "
                           "MedMNIST v2 benchmark does (cross-entropy)")
    return chosen, size


def check_arrays(archive: NpzArchive, chosen: MedmnistSet, named_size: int | None
                 ) -> int:
    """Check the six arrays' presence, dtypes and shapes against the set; its size.

    Raises:
        CapsmedError: naming the file and the first array that is wrong.
    """
    path = archive.path
    wanted = [f"{s}_{k}" for s in SPLITS for k in ("images", "labels")]
    missing = [n for n in wanted if n not in archive.members]
    if missing:
        raise CapsmedError(f"{path}: missing array(s) {', '.join(missing)} (has: "
                           f"{', '.join(archive.members) or 'none'})")
    extra = sorted(set(archive.members) - set(wanted))
    if extra:
        log.warning("%s: arrays not read: %s", path, ", ".join(extra))
    shape = (None, None, 3) if chosen.channels == 3 else (None, None)
    layout = "[N, H, W, 3]" if chosen.channels == 3 else "[N, H, W]"
    sizes = set()
    for split in SPLITS:
        images: Member = archive.members[f"{split}_images"]
        labels: Member = archive.members[f"{split}_labels"]
        if images.dtype != np.uint8:
            raise CapsmedError(f"{path}: {split}_images is {images.dtype}, expected uint8")
        if len(images.shape) != len(shape) + 1 or (chosen.channels == 3 and
                                                   images.shape[-1] != 3):
            raise CapsmedError(f"{path}: {split}_images has shape {list(images.shape)}, "
                               f"expected {layout} ({chosen.flag} is "
                               f"{'RGB' if chosen.channels == 3 else 'grey'})")
        h, w = images.shape[1:3]
        if h != w or h not in SIZES:
            raise CapsmedError(f"{path}: {split}_images are {h}x{w}, expected square "
                               f"images of {', '.join(map(str, SIZES))} px")
        sizes.add(h)
        if labels.dtype.kind not in "iu":
            raise CapsmedError(f"{path}: {split}_labels is {labels.dtype}, expected integers")
        if labels.shape not in ((images.rows, 1), (images.rows,)):
            multi = len(labels.shape) == 2 and labels.shape[1] > 1
            raise CapsmedError(f"{path}: {split}_labels has shape {list(labels.shape)}, "
                               f"expected [{images.rows}, 1]" +
                               (" (several labels per image: multi-label)" if multi else ""))
        if not images.rows:  # the writer would drop the split: no val = no model selection
            raise CapsmedError(f"{path}: {split}_images holds no images; a MedMNIST file "
                               "has images in each of train, val and test")
    if len(sizes) > 1:
        raise CapsmedError(f"{path}: the splits hold images of different sizes "
                           f"({', '.join(map(str, sorted(sizes)))} px)")
    size = sizes.pop()
    if named_size is not None and size != named_size:
        raise CapsmedError(f"{path}: the name announces {named_size} px images, the "
                           f"arrays hold {size} px ones")
    return size


def read_labels(archive: NpzArchive, split: str, classes: int) -> np.ndarray:
    """The labels of ``split`` as int64 [N], each within 0..classes-1."""
    labels = archive.read(f"{split}_labels").reshape(-1).astype(np.int64)
    outside = labels[(labels < 0) | (labels >= classes)]
    if len(outside):
        raise CapsmedError(f"{archive.path}: {split}_labels holds {len(outside)} label(s) "
                           f"outside 0..{classes - 1} (e.g. {int(outside[0])})")
    return labels


def published(chosen: MedmnistSet, size: int, md5: str) -> str | None:
    """Which release published a file with this MD5 (None: not a published file)."""
    if chosen.md5.get(size) == md5:
        return "MedMNIST release 3 (Zenodo record 10519652)"
    if chosen.older_md5.get(size) == md5:
        return "MedMNIST v2 (Zenodo record 6496656)"
    return None


def _check_not_another_set(path: Path, chosen: MedmnistSet, size: int, md5: str,
                           release: str | None) -> None:
    """Refuse another set's published file taken for ``chosen`` (renamed, or ``--set``
    naming the wrong set): its labels would silently get ``chosen``'s class names."""
    if release is not None:
        return
    other = next((s for s in SETS.values() if s is not chosen and published(s, size, md5)),
                 None)
    if other is not None:
        raise CapsmedError(f"{path}: its MD5 {md5} is that of the published "
                           f"{other.file_name(size)}, not a {chosen.flag} file; pass --set "
                           f"{other.flag} (or name the file {other.file_name(size)})")


@claims_output
def preprocess_medmnist(npz_file: Path, output: Path, config: MedmnistConfig | None = None,
                        disable_progress: bool | None = None, overwrite: bool = False
                        ) -> Path:
    """Turn a published MedMNIST ``.npz`` into one HDF5 dataset file (atomically).

    Args:
        npz_file: ``<set>.npz`` or ``<set>_<size>.npz``.
        output: The ``.h5`` file to write.
        config: Processing parameters.
        disable_progress: Unused (the copy is a few seconds); kept for the common call.
        overwrite: Replace ``output`` if it exists (otherwise that is an error).

    Returns:
        ``output``.
    """
    cfg = config or MedmnistConfig()
    path = Path(npz_file)
    chosen, named_size = identify(path, cfg)
    with NpzArchive(path) as archive:
        size = check_arrays(archive, chosen, named_size)
        labels = {s: read_labels(archive, s, len(chosen.classes)) for s in SPLITS}
        md5 = file_md5(path)
        release = published(chosen, size, md5)
        _check_not_another_set(path, chosen, size, md5, release)
        if release is None:
            log.info("%s: not a published %s file (MD5 %s)", path,
                     chosen.file_name(size), md5)
        parameters = {
            "set_name": chosen.flag, "task": chosen.task,
            "ordinal_as_classes": cfg.ordinal_as_classes,
            "size": size, "channels_used": chosen.channels,
            "splits": "official train/val/test of the file",
            "grouping": "per-image: MedMNIST publishes no patient ids, so a patient "
                        "may have images in two splits",
            "images": "stored as published (no resizing or conversion)",
        }
        source = {"raw_dir": str(path.resolve().parent), "file": path.name,
                  "files": {path.name: path.stat().st_size}, "md5": {path.name: md5},
                  "official_files": release is not None, "release": release,
                  "counts": {s: len(labels[s]) for s in SPLITS},
                  "published_counts": dict(zip(SPLITS, chosen.samples, strict=True))}
        writer = DatasetWriter(output, dataset=chosen.flag, kind=SOURCE.name,
                               domain=cfg.domain or chosen.domain,
                               class_names=chosen.classes,
                               image_shape=(chosen.channels, size, size),
                               preprocessing=parameters, source=source)
        with writer:
            for split in SPLITS:
                _copy_split(archive, writer, split, labels[split])
    return output


def _copy_split(archive: NpzArchive, writer: DatasetWriter, split: str,
                labels: np.ndarray) -> None:
    start = 0
    for block in archive.chunks(f"{split}_images"):
        images = block[:, None] if block.ndim == 3 else block.transpose(0, 3, 1, 2)
        index = np.arange(start, start + len(block))
        writer.append(split, np.ascontiguousarray(images), labels[index],
                      np.char.mod(f"{split}-%06d", index),
                      meta={"index": index.astype(np.int32)})
        start += len(block)


def remote(set_name: str, size: int = 28) -> RemoteDataset:
    """Where ``capsmed fetch medmnist`` downloads a set's file, and its published MD5."""
    from capsmed.data.fetch import RemoteDataset

    if set_name not in SETS:
        raise CapsmedError(f"unknown MedMNIST set {set_name!r} (2D sets: "
                           f"{', '.join(SETS)})")
    if size not in SIZES:
        raise CapsmedError(f"--size must be one of {', '.join(map(str, SIZES))}, got {size}")
    chosen = SETS[set_name]
    return RemoteDataset(name=f"medmnist {set_name}", mirrors=(RECORD,),
                         md5={chosen.file_name(size): chosen.md5[size]},
                         homepage="https://medmnist.com/")
