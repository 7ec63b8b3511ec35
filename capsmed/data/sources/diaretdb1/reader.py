"""DIARETDB1 v1.1 fundus images -> HDF5 contract (paper 000's protocol).

Layout (``RAW_DIR`` holds ``resources/``, or is its parent, e.g. the folder holding
``ddb1_v01_01/``, when exactly one child has it)::

    resources/images/ddb1_fundusimages/imageNNN.png
    resources/images/ddb1_groundtruth/<type>/imageNNN.png   (fused confidence maps)
    resources/images/ddb1_fundusmask/fmask.tif              (one field-of-view mask)
    resources/{traindatasets/trainset.txt,testdatasets/testset.txt}  (28 / 61 images)

Each image: CLAHE on Lab lightness -> RGB -> green; lesion mask = union over the chosen
types of value/255 >= confidence; grid and lesion-centred patches inside the fundus,
``lesion`` (enough lesion pixels) or ``healthy`` (unmarked); INTER_AREA resize. Splits
follow the official lists, by image.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from capsmed.data.contract import DatasetWriter
from capsmed.data.enhance import clahe_green
from capsmed.data.output import claims_output
from capsmed.data.patches import grid_centres
from capsmed.data.pool import default_workers, map_in_workers
from capsmed.data.sources.diaretdb1 import SOURCE
from capsmed.data.sources.diaretdb1.config import Diaretdb1Config
from capsmed.data.sources.diaretdb1.layout import (
    CLASS_NAMES,
    LESION_TYPES,
    SPLITS,
    TEST_LIST,
    TRAIN_LIST,
    ImageRecord,
    discover,
    fundus_mask_path,
    read_confidence_map,
    read_fundus_mask,
    read_rgb_png,
    read_split_list,
)
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class _Job:
    index: int
    record: ImageRecord
    mask_path: Path
    config: Diaretdb1Config


@dataclass
class _Result:
    images: np.ndarray  # uint8 [K, 1, S, S]
    labels: np.ndarray  # int64 [K]
    meta: dict[str, np.ndarray]  # row, col (patch centre), lesion_pixels, fov_fraction
    dropped: int  # inside the fundus, but too few lesion pixels to be lesion, marked anyway


def _fundus(path: Path) -> tuple[np.ndarray, tuple[slice, slice], np.ndarray]:
    """The fundus mask as 0/1 uint8, its bounding box and its integral image.

    Read once per worker process: DIARETDB1 has one mask for every image. Cached by
    the file's size and modification time as well, so that a long-lived process
    (capsmed run's worker) never keeps the mask of a file rewritten since.
    """
    try:
        stat = os.stat(path)
        stamp = stat.st_size, stat.st_mtime_ns
    except OSError:  # read_fundus_mask names the problem
        stamp = -1, -1
    return _read_fundus(Path(path), *stamp)


@functools.lru_cache(maxsize=2)
def _read_fundus(path: Path, size: int, mtime_ns: int
                 ) -> tuple[np.ndarray, tuple[slice, slice], np.ndarray]:
    mask = read_fundus_mask(path).view(np.uint8)
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    box = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
    return mask, box, cv2.integral(mask)


def _window_sums(integral: np.ndarray, centres: np.ndarray, size: int) -> np.ndarray:
    """Sum of the image behind ``integral`` in each ``size`` window centred on ``centres``."""
    top = centres[:, 0] - size // 2
    left = centres[:, 1] - size // 2
    bottom, right = top + size, left + size
    return (integral[bottom, right].astype(np.int64) - integral[top, right]
            - integral[bottom, left] + integral[top, left])


def _lesion_centres(lesion: np.ndarray, cfg: Diaretdb1Config,
                    rng: np.random.Generator) -> np.ndarray:
    """One centre per connected lesion component (its pixel nearest the centroid) + copies."""
    k = cfg.lesion_patches_per_component
    if k == 0:
        return np.empty((0, 2), dtype=np.int64)
    n, labels, stats, centroids = cv2.connectedComponentsWithStats(
        lesion.view(np.uint8), connectivity=8)
    centres = []
    for i in range(1, n):
        x, y, bw, bh = stats[i, :4]
        ys, xs = np.nonzero(labels[y:y + bh, x:x + bw] == i)
        # a ring-shaped component's centroid can fall outside it: take its nearest pixel
        j = np.argmin((ys + y - centroids[i, 1]) ** 2 + (xs + x - centroids[i, 0]) ** 2)
        centres.append((ys[j] + y, xs[j] + x))
    base = np.asarray(centres, dtype=np.int64).reshape(-1, 2)
    offsets = rng.integers(-cfg.max_jitter, cfg.max_jitter + 1, size=(len(base), k, 2))
    offsets[:, 0] = 0  # the first copy is exactly centred on its component
    return (base[:, None, :] + offsets).reshape(-1, 2)


def enhance_fundus(rgb: np.ndarray, mask: np.ndarray, box: tuple[slice, slice],
                   clip_limit: float, tile_grid: tuple[int, int]) -> np.ndarray:
    """Paper 000's fundus enhancement, (H, W) uint8: CLAHE green over the field of
    view's bounding box ``box`` (paper 000 crops the black margin first, so the tiles
    cover retina), then 0 outside the 0/1 ``mask``."""
    green = np.zeros(rgb.shape[:2], dtype=np.uint8)
    green[box] = clahe_green(rgb[box], clip_limit, tile_grid)
    green *= mask.view(np.uint8) if mask.dtype == np.bool_ else mask
    return green


def process_image(job: _Job) -> _Result:
    """Enhance one fundus image and cut its labelled patches (runs in a worker)."""
    cfg, rec = job.config, job.record
    rgb = read_rgb_png(rec.png)
    h, w = rgb.shape[:2]
    mask, box, fov_integral = _fundus(job.mask_path)
    if mask.shape != (h, w):
        raise CapsmedError(f"{rec.png}: image is {w}x{h} but the fundus mask {job.mask_path} "
                           f"is {mask.shape[1]}x{mask.shape[0]}")
    size, half = cfg.patch_size, cfg.patch_size // 2
    if h < size or w < size:
        raise CapsmedError(f"{rec.png}: {w}x{h} is smaller than one {size} px patch; "
                           "choose a smaller patch_size")
    # the smallest uint8 value with value/255 >= confidence (float64, as the toolkit does)
    threshold = int(np.argmax(np.arange(257) / 255.0 >= cfg.confidence))
    lesion = np.zeros((h, w), dtype=bool)
    annotated = np.zeros((h, w), dtype=bool)
    for kind in LESION_TYPES:
        values = read_confidence_map(rec.ground_truth[kind], (h, w), rec.png.name)
        annotated |= values > 0
        if kind in cfg.lesions:
            lesion |= values >= threshold

    green = enhance_fundus(rgb, mask, box, cfg.clip_limit, cfg.tile_grid)

    rng = np.random.default_rng([cfg.seed, job.index])
    centres = np.concatenate([grid_centres(h, w, cfg.patch_size, cfg.stride),
                              _lesion_centres(lesion, cfg, rng)])
    # keep every window inside the image (a lesion pixel stays inside its clipped window)
    centres = np.clip(centres, half, [h - size + half, w - size + half])
    _, first = np.unique(centres, axis=0, return_index=True)
    centres = centres[np.sort(first)]

    lesion_px = _window_sums(cv2.integral(lesion.view(np.uint8)), centres, size)
    annotated_px = _window_sums(cv2.integral(annotated.view(np.uint8)), centres, size)
    fov = _window_sums(fov_integral, centres, size) / float(size * size)
    inside = fov >= cfg.min_fov
    lesion_ok = inside & (lesion_px >= cfg.lesion_pixels_needed)
    healthy_ok = inside & (annotated_px == 0)
    keep = lesion_ok | healthy_ok
    centres = centres[keep]
    out = cfg.output_size
    patches = [cv2.resize(green[r - half:r - half + size, c - half:c - half + size],
                          (out, out), interpolation=cv2.INTER_AREA) for r, c in centres]
    images = (np.stack(patches) if patches else np.empty((0, out, out), np.uint8))[:, None]
    meta = {"row": centres[:, 0].astype(np.int32), "col": centres[:, 1].astype(np.int32),
            "lesion_pixels": lesion_px[keep].astype(np.int32),
            "fov_fraction": fov[keep].astype(np.float32)}
    return _Result(images, lesion_ok[keep].astype(np.int64), meta, int((inside & ~keep).sum()))


def assign_splits(records: list[ImageRecord], resources: Path,
                  cfg: Diaretdb1Config) -> dict[str, str]:
    """``{image_id: split}`` from the official (or the user's) lists, val carved by image."""
    available = {r.image_id for r in records}
    files = ({s: Path(p) for s, p in cfg.split_files.items()} if cfg.split_files
             else {"train": resources / TRAIN_LIST, "test": resources / TEST_LIST})
    split_of: dict[str, str] = {}
    origin: dict[str, Path] = {}
    for split, path in files.items():
        for image_id in read_split_list(path):
            if image_id not in available:
                raise CapsmedError(f"{path}: lists {image_id}, but there is no "
                                   f"{image_id}.png among the fundus images")
            if split_of.get(image_id, split) != split:
                raise CapsmedError(f"{path}: {image_id} is also listed in {origin[image_id]}; "
                                   "splits must be disjoint")
            split_of[image_id], origin[image_id] = split, path
    train = sorted(i for i, s in split_of.items() if s == "train")
    if "val" not in files and cfg.val_fraction > 0 and len(train) >= 2:
        n_val = min(len(train) - 1, max(1, round(cfg.val_fraction * len(train))))
        for idx in np.random.default_rng(cfg.seed).permutation(len(train))[:n_val]:
            split_of[train[idx]] = "val"
    left_out = sorted(available - set(split_of))
    if left_out:
        log.warning("%d image(s) in no split list are left out: %s", len(left_out),
                    ", ".join(left_out[:8]))
    return split_of


def _balanced(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices keeping every sample of the smaller class and as many of the larger."""
    by_class = [np.flatnonzero(labels == c) for c in range(len(CLASS_NAMES))]
    smallest = min(len(i) for i in by_class)
    if smallest == 0:
        return np.arange(len(labels))
    chosen = [i if len(i) == smallest else rng.choice(i, smallest, replace=False)
              for i in by_class]
    return np.sort(np.concatenate(chosen))


@claims_output
def preprocess_diaretdb1(raw_dir: Path, output: Path, config: Diaretdb1Config | None = None,
                         disable_progress: bool | None = None, overwrite: bool = False
                         ) -> Path:
    """Turn a DIARETDB1 v1.1 folder into one HDF5 dataset file (atomically).

    Args:
        raw_dir: Folder holding ``resources/`` (or its unambiguous parent).
        output: The ``.h5`` file to write.
        config: Processing parameters (defaults: paper 000 and the toolkit's 0.75).
        disable_progress: Hide the progress bar.
        overwrite: Replace ``output`` if it exists (otherwise that is an error).

    Returns:
        ``output``.
    """
    cfg = config or Diaretdb1Config()
    raw_dir, output = Path(raw_dir), Path(output)
    resources, records = discover(raw_dir)
    mask_path = fundus_mask_path(resources)
    _fundus(mask_path)  # fail early, in this process, on a missing or empty mask
    split_of = assign_splits(records, resources, cfg)
    records = [r for r in records if r.image_id in split_of]
    jobs = [_Job(i, r, mask_path, cfg) for i, r in enumerate(records)]
    workers = default_workers(cfg.workers)
    log.info("%d DIARETDB1 images (%s); %d worker(s)", len(records), ", ".join(
        f"{s}={sum(v == s for v in split_of.values())}" for s in SPLITS), workers)

    collected: dict[str, list[tuple[ImageRecord, _Result]]] = {s: [] for s in SPLITS}
    for job, res in map_in_workers(process_image, jobs, workers=workers,
                                   description="DIARETDB1 images",
                                   disable_progress=disable_progress):
        collected[split_of[job.record.image_id]].append((job.record, res))

    def rel(path: Path) -> str:
        return path.relative_to(raw_dir).as_posix()

    files = [r.png for r in records] + [p for r in records for p in r.ground_truth.values()]
    files += [mask_path] + [Path(p) for p in (cfg.split_files or {}).values()]
    files += [] if cfg.split_files else [resources / TRAIN_LIST, resources / TEST_LIST]
    source = {"raw_dir": str(raw_dir.resolve()), "layout": "diaretdb1 v1.1",
              "files": {(rel(p) if p.is_relative_to(raw_dir) else str(p)): p.stat().st_size
                        for p in files}}
    parameters = cfg.parameters()
    parameters.update(
        enhancement="CLAHE on L of Lab (cv2, over the fundus mask's bounding box) -> RGB -> "
                    "green; 0 outside the fundus mask", resize="cv2.INTER_AREA",
        min_lesion_pixels_used=cfg.lesion_pixels_needed, jitter_used=cfg.max_jitter,
        lesion_rule="union over lesions of map[..., 0] / 255 >= confidence",
        healthy_rule="no pixel > 0 in any of the four maps", split_unit="image",
        images={s: sorted(i for i, v in split_of.items() if v == s) for s in SPLITS},
        candidates={s: np.bincount(np.concatenate([r.labels for _, r in items] or [[]])
                                   .astype(np.int64), minlength=2).tolist()
                    for s, items in collected.items()},
        dropped_ambiguous=sum(r.dropped for v in collected.values() for _, r in v))
    writer = DatasetWriter(output, dataset="diaretdb1", kind=SOURCE.name,
                           domain=SOURCE.domain, class_names=CLASS_NAMES,
                           image_shape=(1, cfg.output_size, cfg.output_size),
                           preprocessing=parameters, source=source,
                           allow_group_leak=cfg.allow_group_leak)
    with writer:
        for number, split in enumerate(SPLITS):
            items = collected[split]
            if not items:
                continue
            labels = np.concatenate([r.labels for _, r in items])
            meta = {k: np.concatenate([r.meta[k] for _, r in items]) for k in items[0][1].meta}
            meta["source"] = np.concatenate([[rel(rec.png)] * len(r.labels) for rec, r in items])
            groups = np.concatenate([[rec.image_id] * len(r.labels) for rec, r in items])
            keep = (_balanced(labels, np.random.default_rng([cfg.seed, number]))
                    if cfg.balance else np.arange(len(labels)))
            counts = np.bincount(labels[keep], minlength=2)
            if counts.min() == 0:
                log.warning("split '%s' has no %s patches", split, CLASS_NAMES[counts.argmin()])
            images = np.concatenate([r.images for _, r in items])[keep]
            writer.append(split, images, labels[keep], groups[keep].tolist(),
                          meta={k: v[keep] for k, v in meta.items()})
            log.info("%s: %d healthy, %d lesion patches from %d images", split, *counts,
                     len(items))
    return output
