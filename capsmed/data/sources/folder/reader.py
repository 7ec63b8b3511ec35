"""Any folder of class subfolders -> HDF5 contract (``capsmed preprocess folder``).

Layout: ``ROOT/<class>/<images>``; images may sit in nested subfolders of a class
folder. Extensions png, jpg, jpeg, tif, tiff, bmp (any case); hidden files and folders
(``.name``) and files directly in ROOT are ignored. Class names are the sorted
subfolder names unless chosen (and ordered) with ``classes``.

Each image is read (tifffile for TIFF, OpenCV for the rest), scaled to 8 bits, turned
into RGB order, converted to the wanted channel count and resized. Samples are grouped
by patient (a regex on the file name, or a CSV) so that splits and folds are made by
group; without either, every image is its own group.
"""

from __future__ import annotations

import csv
import logging
import os
import re
import unicodedata
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from capsmed.data.contract import DatasetWriter
from capsmed.data.files import FolderWalk, check_file, check_name, refuse_same_stem, shown
from capsmed.data.images import (
    UNREAD_IMAGE_EXTENSIONS,
    convert_channels,
    exif_orientation,
    read_image,
    resize_image,
    to_uint8,
)
from capsmed.data.normalise import StainNormaliser, build_normaliser
from capsmed.data.output import claims_output
from capsmed.data.pool import default_workers, map_in_workers
from capsmed.data.schema import class_index, refuse_total_row_name
from capsmed.data.sources.folder import SOURCE
from capsmed.data.sources.folder.config import FolderConfig
from capsmed.data.splits import assign_splits as assign_group_splits
from capsmed.data.splits import warn_missing_classes
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
FILES_PER_JOB = 64  # a worker job reads this many files: amortises pickling and start-up
LOW_RANGE_16BIT = 4096  # a 16-bit image whose maximum is below this holds <= 12 bits


@dataclass(frozen=True)
class ImageFile:
    """One image: its path, its path relative to ROOT (POSIX form) and its label."""

    path: Path
    rel: str
    label: int


def discover(root: Path, classes: tuple[str, ...] | None = None
             ) -> tuple[list[str], list[ImageFile]]:
    """Class names and every image under ``root/<class>/`` (sorted by class, then path)."""
    root = Path(root)
    if not root.is_dir():
        raise CapsmedError(f"{root}: no such folder (expected ROOT/<class>/<images>)")
    entries = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    for path in entries:
        check_name(path)
        if path.is_symlink() and not path.exists() and not path.suffix:
            check_file(path, "class folder")  # a broken link or a loop: say so
    present = [p.name for p in entries if p.is_dir()]
    if not present:
        raise CapsmedError(f"{root}: no class folders (expected ROOT/<class>/<images>)")
    # a name typed in NFC finds its folder spelled in NFD (macOS), and keeps that spelling
    names = ([present[i] if (i := class_index(present, c)) is not None else c for c in classes]
             if classes else present)
    for name in names:
        if not (root / name).is_dir():
            raise CapsmedError(f"{root / name}: class folder not found (found: "
                               f"{', '.join(present)})")
    if len(set(names)) != len(names):
        raise CapsmedError(f"{root}: a class is named twice in {', '.join(names)}")
    for name in names:
        refuse_total_row_name([name], root / name)
    folded: dict[str, str] = {}
    for name in names:  # Benign/ and benign/ are one class to a reader, two to a model
        # NFC and NFD spellings of one name (a folder copied from macOS beside one typed
        # on Linux) look the same in every report and column: one class shown twice.
        key = unicodedata.normalize("NFC", name).casefold()
        if folded.setdefault(key, name) != name:
            raise CapsmedError(f"{root}: class folders {folded[key]!r} and {name!r} differ "
                               "only in case or Unicode form (NFC/NFD); merge them or "
                               "rename one")
    if classes and set(present) - set(names):
        log.info("class folders left out: %s", ", ".join(sorted(set(present) - set(names))))
    files: list[ImageFile] = []
    walk = FolderWalk()  # one walk: a folder linked into two classes is an error
    for label, name in enumerate(names):
        others: list[Path] = []
        found = refuse_same_stem(walk.files(root / name, IMAGE_EXTENSIONS, others=others))
        unread = [p for p in others if p.suffix.lower() in UNREAD_IMAGE_EXTENSIONS]
        if unread:
            raise CapsmedError(
                f"{shown(unread[0])}: a {unread[0].suffix[1:].upper()} image, a format the "
                f"folder source does not read ({len(unread)} such file(s) in class "
                f"{name!r}); convert them to "
                f"{', '.join(e[1:] for e in IMAGE_EXTENSIONS)} or move them out")
        if not found:
            raise CapsmedError(f"{root / name}: class folder holds no images "
                               f"({', '.join(e[1:] for e in IMAGE_EXTENSIONS)})")
        files += [ImageFile(p, p.relative_to(root).as_posix(), label) for p in found]
    return names, files


def load_image(path: Path, channels: int | None, cfg: FolderConfig,
               stain: StainNormaliser | None = None
               ) -> tuple[np.ndarray, tuple[int, int], int, bool]:
    """Read and convert one image -> ((C, H, W) uint8, native (H, W), native channel
    count, whether it is a 16-bit image using only 12 bits or fewer); ``stain``
    normalises its colours (at the native size, before resizing)."""
    raw = read_image(path)
    low_range = raw.dtype == np.uint16 and int(raw.max()) < LOW_RANGE_16BIT
    native = 1 if raw.ndim == 2 or raw.shape[-1] <= 2 else 3
    image = convert_channels(to_uint8(raw, cfg.scale16, path), channels or native)
    if stain is not None:
        if native != 3:  # checked on the file: --channels 3 copies grey into RGB
            raise CapsmedError(f"{path}: a grey image; stain normalisation needs colour "
                               "(RGB) images")
        image = stain.apply(image)
    if cfg.size is not None:
        image = resize_image(image, cfg.size, cfg.keep_aspect)
    return np.ascontiguousarray(image.transpose(2, 0, 1)), raw.shape[:2], native, low_range


@dataclass(frozen=True)
class _Job:
    start: int
    paths: tuple[Path, ...]
    channels: int
    shape: tuple[int, int]  # output (H, W)
    config: FolderConfig
    stain: StainNormaliser | None = None


@dataclass
class _Result:
    images: np.ndarray
    native_sizes: np.ndarray
    converted: int
    low_range: int
    turned: list[str]  # names of files with an EXIF orientation other than upright


def process_chunk(job: _Job) -> _Result:
    """Read and convert a chunk of files (runs in a worker process)."""
    images, sizes, converted, low = [], [], 0, 0
    turned: list[str] = []
    for path in job.paths:
        image, native_size, native_channels, low_range = load_image(path, job.channels,
                                                                    job.config, job.stain)
        if image.shape[1:] != job.shape:
            raise CapsmedError(f"{path}: size {native_size[0]}x{native_size[1]} differs from "
                               f"the first image's {job.shape[0]}x{job.shape[1]}; pass a "
                               "size to resize every image")
        images.append(image)
        sizes.append(native_size)
        converted += native_channels != job.channels
        low += low_range
        if exif_orientation(path) != 1:
            turned.append(path.name)
    return _Result(np.stack(images), np.asarray(sizes, np.int32), converted, low, turned)


def _normalise_rel(text: str) -> str:
    return PurePosixPath(os.path.normpath(text.strip().replace("\\", "/"))).as_posix()


def read_groups_csv(path: Path, root: Path, files: list[ImageFile]) -> list[str]:
    """Groups of ``files`` from a ``file,group`` CSV (optional header; paths relative to
    ``root``). A listed file that does not exist, or an image not listed, is an error."""
    path = Path(path)
    try:
        rows = list(csv.reader(path.read_text(encoding="utf-8-sig").splitlines()))
    except (OSError, UnicodeDecodeError) as exc:
        raise CapsmedError(f"{path}: cannot read groups CSV ({exc})") from exc
    groups: dict[str, str] = {}
    for number, row in enumerate(rows, start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if number == 1 and [c.strip().lower() for c in row[:2]] in (
                ["file", "group"], ["path", "group"], ["filename", "group"]):
            continue
        if len(row) < 2 or not row[0].strip() or not row[1].strip():
            raise CapsmedError(f"{path}: line {number}: expected 'file,group', got "
                               f"{','.join(row)!r}")
        rel = _normalise_rel(row[0])
        if not (root / rel).is_file():
            raise CapsmedError(f"{path}: line {number}: {row[0].strip()} does not exist "
                               f"under {root}")
        if groups.get(rel, row[1].strip()) != row[1].strip():
            raise CapsmedError(f"{path}: line {number}: {rel} is given two groups")
        groups[rel] = row[1].strip()
    missing = [f for f in files if f.rel not in groups]
    if missing:
        raise CapsmedError(f"{missing[0].path}: not listed in {path} ({len(missing)} "
                           "image(s) have no group)")
    return [groups[f.rel] for f in files]


def refuse_unicode_twins(groups: list[str], where: Path | str) -> list[str]:
    """``groups`` unless two of them differ only in Unicode form (NFC/NFD): file names
    copied from macOS beside ones made on Linux would make one patient two groups, free
    to land in two splits."""
    seen: dict[str, str] = {}
    for group in groups:
        first = seen.setdefault(unicodedata.normalize("NFC", group), group)
        if first != group:
            raise CapsmedError(f"{where}: groups {ascii(first)} and {ascii(group)} differ "
                               "only in Unicode form (NFC/NFD), one patient counted as "
                               "two; write them in one form")
    return groups


def assign_groups(root: Path, files: list[ImageFile], cfg: FolderConfig) -> list[str]:
    """Group (patient) of every file: regex on the name, CSV, or the file itself."""
    if cfg.groups_csv:
        return refuse_unicode_twins(read_groups_csv(Path(cfg.groups_csv), root, files),
                                    cfg.groups_csv)
    if not cfg.group_pattern:
        log.warning("no group pattern or groups CSV: every image is its own group, so "
                    "splits are by image, not by patient")
        return [f.rel for f in files]
    try:
        pattern = re.compile(cfg.group_pattern)
    except re.error as exc:
        raise CapsmedError(f"group pattern {cfg.group_pattern!r}: invalid regex ({exc})") from exc
    if pattern.groups != 1:
        raise CapsmedError(f"group pattern {cfg.group_pattern!r}: needs exactly one capture "
                           f"group (...), has {pattern.groups}")
    groups = []
    for f in files:
        match = pattern.search(f.path.name)
        if not match or not match.group(1):
            raise CapsmedError(f"{f.path}: file name does not match the group pattern "
                               f"{cfg.group_pattern!r}")
        groups.append(match.group(1))
    return refuse_unicode_twins(groups, root)


def assign_splits(root: Path, labels: np.ndarray, groups: list[str], cfg: FolderConfig
                  ) -> tuple[list[str | None], np.ndarray | None]:
    """Split of every file (None = left out) and, with ``folds``, its fold."""
    if cfg.folds:
        from sklearn.model_selection import StratifiedGroupKFold

        if len(set(groups)) < cfg.folds:
            raise CapsmedError(f"{root}: {len(set(groups))} group(s) cannot fill "
                               f"{cfg.folds} folds")
        folds = np.zeros(len(groups), np.int8)
        splitter = StratifiedGroupKFold(n_splits=cfg.folds, shuffle=True,
                                        random_state=cfg.seed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for k, (_, held) in enumerate(splitter.split(labels, labels, groups)):
                folds[held] = k
        for w in caught:  # e.g. a class with fewer members than folds
            log.warning("%s", w.message)
        return ["all"] * len(groups), folds
    split_of = assign_group_splits(groups, cfg.split_files, cfg.fractions, cfg.seed)
    return [split_of.get(g) for g in groups], None


@claims_output
def preprocess_folder(root: Path, output: Path, config: FolderConfig | None = None,
                      disable_progress: bool | None = None, overwrite: bool = False
                      ) -> Path:
    """Turn ``root/<class>/<images>`` into one HDF5 dataset file (atomically).

    Args:
        root: Folder of class subfolders.
        output: The ``.h5`` file to write.
        config: Processing parameters.
        disable_progress: Hide the progress bar.
        overwrite: Replace ``output`` if it exists (otherwise that is an error).

    Returns:
        ``output``.
    """
    cfg = config or FolderConfig()
    root, output = Path(root), Path(output)
    stain = build_normaliser(cfg.stain_norm, cfg.stain_target)
    class_names, files = discover(root, cfg.classes)
    groups = assign_groups(root, files, cfg)
    labels = np.array([f.label for f in files], np.int64)
    splits, folds = assign_splits(root, labels, groups, cfg)
    keep = [i for i, s in enumerate(splits) if s is not None]
    if not keep:
        raise CapsmedError(f"{root}: no image is in any split")

    # The first image fixes the channel count (unless given) and, without a size, the
    # image size every other image must share.
    first, *_ = load_image(files[keep[0]].path, cfg.channels, cfg, stain)
    channels, shape = first.shape[0], first.shape[1:]
    workers = default_workers(cfg.workers)
    jobs = [_Job(s, tuple(files[i].path for i in keep[s:s + FILES_PER_JOB]), channels, shape,
                 cfg, stain) for s in range(0, len(keep), FILES_PER_JOB)]
    counts = np.bincount(labels[keep], minlength=len(class_names))
    log.info("%d images in %d classes (%s); %d group(s); %d worker(s)", len(keep),
             len(class_names), ", ".join(f"{n}={c}" for n, c in zip(class_names, counts,
                                                                     strict=True)),
             len(set(groups)), min(workers, len(jobs)))
    warn_missing_classes({s: [labels[i] for i in keep if splits[i] == s]
                          for s in sorted({splits[i] for i in keep})}, class_names)

    parameters = {k: v for k, v in asdict(cfg).items() if k != "workers"}
    parameters.update(
        classes=class_names, channels_used=int(channels), image_size_used=list(shape),
        reader="tifffile (TIFF, first page); cv2.imdecode IMREAD_UNCHANGED (others)",
        colour="BGR->RGB, alpha dropped, grey = ITU-R 601 luma",
        resize="cv2.INTER_AREA shrinking, cv2.INTER_LINEAR enlarging",
        grouping="groups_csv" if cfg.groups_csv else
        "group_pattern" if cfg.group_pattern else "per-image",
        split_unit="group")
    if stain is not None:
        parameters.update(stain_normalisation=stain.to_record(),
                          stain_norm_unit="each image at its native size, before resizing")
    source = {"raw_dir": str(root.resolve()),
              "files": {files[i].rel: files[i].path.stat().st_size for i in keep}}
    converted = low_range = 0
    turned: list[str] = []
    writer = DatasetWriter(output, dataset=cfg.name or root.resolve().name,
                           kind=SOURCE.name, domain=cfg.domain,
                           class_names=class_names, image_shape=(channels, *shape),
                           preprocessing=parameters, source=source,
                           allow_group_leak=cfg.allow_group_leak)
    with writer:
        for job, res in map_in_workers(process_chunk, jobs, workers=workers,
                                       description="images", disable_progress=disable_progress):
            index = np.array(keep[job.start:job.start + len(job.paths)])
            chunk_splits = np.array([splits[i] for i in index])
            for split in dict.fromkeys(chunk_splits):  # first-seen order: deterministic
                sel = chunk_splits == split
                idx = index[sel]
                writer.append(
                    split, res.images[sel], labels[idx], [groups[i] for i in idx],
                    meta={"source": np.array([files[i].rel for i in idx]),
                          "source_height": res.native_sizes[sel, 0],
                          "source_width": res.native_sizes[sel, 1]},
                    folds=folds[idx] if folds is not None else None)
            converted += res.converted
            low_range += res.low_range
            turned += res.turned
    if converted and channels == 1 and cfg.channels is None:  # colour lost, unasked
        log.warning("%d colour image(s) converted to grey because the first image (%s) is "
                    "grey; pass --channels 3 to keep their colour", converted,
                    files[keep[0]].rel)
    elif converted:
        log.info("%d image(s) converted to %s", converted, "grey" if channels == 1 else "RGB")
    if turned:
        log.warning("%d image(s) carry an EXIF orientation (%s%s) that is not applied: "
                    "they are stored as their pixels lie, as most training libraries read "
                    "them; rotate the files first if the camera's view matters",
                    len(turned), ", ".join(turned[:3]), ", ..." if len(turned) > 3 else "")
    if low_range and cfg.scale16 == "full":
        log.warning("%d 16-bit image(s) use 12 bits or fewer and come out dark with "
                    "scale16=full; consider scale16=minmax (--scale16 minmax)", low_range)
    return output
