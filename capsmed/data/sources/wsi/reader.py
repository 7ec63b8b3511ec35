"""Whole-slide images -> HDF5 contract: tissue mask, grid tiles, labels from annotations.

Slides are opened by :func:`open_slide`, a reader factory in the spirit of TIAToolbox's
``WSIReader.open``: ``openslide.open_slide`` picks the vendor driver (svs, ndpi, mrxs,
generic tiled TIFF, ...) and falls back to ``ImageSlide`` (Pillow) for plain TIFF/PNG.

Per slide: a thumbnail at ``level-0 / mask_downsample`` -> Otsu threshold of its HSV
saturation (glass is unsaturated, stained tissue is not) -> small specks removed and
small holes filled -> a grid of ``tile_size`` tiles at the chosen level or microns per
pixel -> tiles with at least ``min_tissue`` tissue kept -> labels from points, polygons
or the slide's label (``annotations.py``) -> ``read_region`` (RGBA composited on white)
-> INTER_AREA resize -> RGB or hematoxylin. Splits are by slide, never by tile.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from capsmed.data.contract import DatasetWriter
from capsmed.data.digest import file_digest
from capsmed.data.normalise import StainNormaliser, build_normaliser
from capsmed.data.output import claims_output
from capsmed.data.pool import default_workers, map_in_workers
from capsmed.data.resume import ResultCache
from capsmed.data.slides import (
    Resolution,
    SlideInfo,
    describe_slide,
    find_slides,
    open_slide,
    read_tile,
    square_mpp,
    tissue_fractions,
)
from capsmed.data.sources.wsi import SOURCE, tile_labels
from capsmed.data.sources.wsi.config import WsiConfig
from capsmed.data.splits import assign_splits, warn_missing_classes
from capsmed.data.stains import hematoxylin_channel
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)

LEVEL_TOLERANCE = 0.01  # a level within 1% of the wanted downsample is read without resampling


def choose_resolution(info: SlideInfo, cfg: WsiConfig) -> Resolution:
    """Pick the level to read and the resampling needed for ``cfg.level`` / ``cfg.mpp``."""
    downsamples = info.level_downsamples
    if cfg.mpp is None:
        level = cfg.level or 0
        if level >= len(downsamples):
            raise CapsmedError(f"{info.path}: level {level} asked but the slide has "
                               f"{len(downsamples)} level(s) (0-{len(downsamples) - 1})")
        ds = downsamples[level]
        return Resolution(level, ds, cfg.tile_size, None if info.mpp is None else info.mpp * ds)
    if info.mpp is None:
        raise CapsmedError(f"{info.path}: --mpp {cfg.mpp} asked but the slide has no "
                           "microns-per-pixel metadata; use --level instead")
    target = cfg.mpp / square_mpp(info, cfg.mpp)
    if target < 1 - LEVEL_TOLERANCE:
        raise CapsmedError(f"{info.path}: --mpp {cfg.mpp} is finer than the slide's level 0 "
                           f"({info.mpp:.4g} um/px); upsampling is not supported")
    level = max(i for i, d in enumerate(downsamples) if d <= target * (1 + LEVEL_TOLERANCE))
    if abs(downsamples[level] / target - 1) <= LEVEL_TOLERANCE:
        return Resolution(level, downsamples[level], cfg.tile_size, info.mpp * downsamples[level])
    read = round(cfg.tile_size * target / downsamples[level])
    return Resolution(level, target, read, cfg.mpp)


def tissue_mask(thumb: np.ndarray, cfg: WsiConfig) -> tuple[np.ndarray, float]:
    """Tissue mask of an RGB thumbnail: Otsu on HSV saturation, then cleanup.

    Returns:
        (bool mask, saturation threshold used).
    """
    sat = cv2.cvtColor(np.ascontiguousarray(thumb), cv2.COLOR_RGB2HSV)[..., 1]
    if cfg.mask_blur > 1:
        sat = cv2.medianBlur(sat, cfg.mask_blur)
    otsu, _ = cv2.threshold(sat, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    threshold = max(float(otsu), float(cfg.min_saturation))
    mask = sat > threshold

    def small_parts(binary: np.ndarray, max_area: int, inner: bool) -> np.ndarray:
        _, lab, stats, _ = cv2.connectedComponentsWithStats(binary.astype(np.uint8), 8)
        x, y, w, h, area = stats.T
        small = area <= max_area
        if inner:  # background that reaches the border surrounds the tissue: not a hole
            small &= (x > 0) & (y > 0) & (x + w < binary.shape[1]) & (y + h < binary.shape[0])
        small[0] = False  # label 0 is the complement of the components
        return small[lab]

    if cfg.min_object_area:
        mask &= ~small_parts(mask, cfg.min_object_area, inner=False)
    if cfg.max_hole_area:
        mask |= small_parts(~mask, cfg.max_hole_area, inner=True)
    return mask, threshold


def grid_edges(extent0: int, res: Resolution, cfg: WsiConfig) -> np.ndarray:
    """Level-0 left (or top) edges of whole tiles along one axis of ``extent0`` px."""
    span = extent0 / res.downsample  # axis length at the tiling resolution
    # a tile that fits exactly is kept: 896 / (0.28 / 0.2) is 639.99999999999989
    fits = (span - cfg.tile_size) / cfg.step + 1e-9
    n = int(math.floor(fits)) + 1 if fits >= 0 else 0
    return np.round(np.arange(n) * cfg.step * res.downsample).astype(np.int64)


_MASKS: dict[tuple, tuple[np.ndarray, float]] = {}  # per worker: the current slide's mask


def slide_mask(info: SlideInfo, cfg: WsiConfig) -> tuple[np.ndarray, float]:
    """Tissue mask and threshold of a slide's thumbnail, kept while its bands are read."""
    path = Path(info.path)
    key = (str(path.resolve()), path.stat().st_mtime_ns, cfg.mask_downsample, cfg.mask_blur,
           cfg.min_saturation, cfg.min_object_area, cfg.max_hole_area)
    if key not in _MASKS:
        w0, h0 = info.dimensions
        size = (max(1, round(w0 / cfg.mask_downsample)), max(1, round(h0 / cfg.mask_downsample)))
        with open_slide(path) as slide:
            try:
                thumb = np.asarray(slide.get_thumbnail(size).convert("RGB"))
            except Exception as exc:  # OpenSlide / Pillow raise many types on corrupt data
                raise CapsmedError(f"{path}: cannot read the slide thumbnail "
                                   f"({type(exc).__name__}: {exc})") from None
        _MASKS.clear()  # bands come slide after slide: one mask is enough
        _MASKS[key] = tissue_mask(thumb, cfg)
    return _MASKS[key]


@dataclass(frozen=True)
class _Band:
    """A job: grid rows ``rows`` of one slide (a big slide is cut into several bands)."""

    info: SlideInfo
    res: Resolution
    cfg: WsiConfig
    labels: tile_labels.SlideLabels
    rows: tuple[int, int]
    stain: StainNormaliser | None = None


@dataclass
class BandResult:
    """Kept tiles of a band: images, labels, level-0 (x, y), tissue share, counts."""

    images: np.ndarray
    labels: np.ndarray
    coords: np.ndarray
    tissue: np.ndarray
    counts: dict[str, int]
    points_hit: np.ndarray | None
    mask: dict[str, Any]


def read_tiles(slide: Any, path: Path, lefts: np.ndarray, res: Resolution,
               cfg: WsiConfig, stain: StainNormaliser | None = None) -> np.ndarray:
    """The dataset images [n, C, out, out] uint8 of the tiles whose level-0 top-left
    corners are ``lefts`` (n, 2) as (x, y): read, resized, stain-normalised (each tile
    with its own statistics), RGB or hematoxylin."""
    import openslide

    images = []
    for x, y in np.asarray(lefts).reshape(-1, 2).tolist():
        try:
            rgb = read_tile(slide, x, y, res, cfg.out_size)
        except (openslide.OpenSlideError, OSError, ValueError) as exc:
            raise CapsmedError(f"{path}: cannot read the tile at x={x}, y={y}, level "
                               f"{res.level} ({type(exc).__name__}: {exc})") from None
        if stain is not None:
            rgb = stain.apply(rgb)
        images.append(hematoxylin_channel(rgb, cfg.h_max)[None]
                      if cfg.stain == "hematoxylin" else rgb.transpose(2, 0, 1))
    channels = 1 if cfg.stain == "hematoxylin" else 3
    return (np.stack(images) if images else
            np.empty((0, channels, cfg.out_size, cfg.out_size), dtype=np.uint8))


def process_band(job: _Band) -> BandResult:
    """Mask, keep, label and read the tiles of one band (runs in a worker process)."""

    cfg, info, res = job.cfg, job.info, job.res
    mask, threshold = slide_mask(info, cfg)
    xs = grid_edges(info.dimensions[0], res, cfg)
    ys = grid_edges(info.dimensions[1], res, cfg)[job.rows[0]:job.rows[1]]
    footprint = res.footprint(cfg.tile_size)
    frac = tissue_fractions(mask, info.dimensions, xs, ys, footprint)
    keep = frac >= cfg.min_tissue
    rows, cols = np.nonzero(keep)  # row-major: tiles ordered top to bottom, left to right
    coords = np.stack([xs[cols], ys[rows]], axis=1).astype(np.int64).reshape(-1, 2)
    tissue = frac[rows, cols].astype(np.float32)
    labels, counts, hit = job.labels.label_tiles(xs, ys, keep, coords, footprint)
    counts = {"tissue_tiles": len(coords), **counts}
    unlabelled = labels < 0
    if cfg.unlabelled == "drop":
        counts["dropped_unlabelled"] = int(unlabelled.sum())
        coords, labels, tissue = coords[~unlabelled], labels[~unlabelled], tissue[~unlabelled]
    else:
        counts["background_tiles"] = int(unlabelled.sum())
        labels = np.where(unlabelled, job.labels.class_index.get(cfg.background_class, -1),
                          labels)
    with open_slide(Path(info.path)) as slide:
        stack = read_tiles(slide, Path(info.path), coords, res, cfg, job.stain)
    return BandResult(stack, labels.astype(np.int64), coords, tissue, counts, hit,
                      {"mask_shape": list(mask.shape), "mask_threshold": threshold,
                       "tissue_share": float(mask.mean())})


def _check_one_scale(resolutions: dict[str, Resolution], by_id: dict[str, SlideInfo],
                     cfg: WsiConfig) -> None:
    """Refuse slides tiled at a fixed level whose microns per pixel there differ by more
    than :data:`LEVEL_TOLERANCE`: one dataset would mix tissue at different physical
    scales (a 20x and a 40x scan). ``--mpp`` tiles every slide at one scale. Where a
    slide has no mpp metadata, objective powers are compared instead; a slide with
    neither is not compared: nothing says at which scale it is."""
    if cfg.mpp is not None:
        return
    known = {s: r.mpp for s, r in resolutions.items() if r.mpp}
    fine = min(known, key=known.__getitem__, default=None)
    coarse = max(known, key=known.__getitem__, default=None)
    if fine is not None and known[coarse] / known[fine] - 1 > LEVEL_TOLERANCE:
        level = resolutions[coarse].level
        raise CapsmedError(f"{by_id[coarse].path}: {known[coarse]:.4g} um/px at level "
                           f"{level}, but {by_id[fine].path} is {known[fine]:.4g} um/px "
                           "there: their tiles would show tissue at different scales; give "
                           f"--mpp (e.g. --mpp {known[coarse]:.4g}) to tile every slide at "
                           "one resolution")
    if len(known) < len(resolutions):
        _check_one_power(resolutions, by_id)


def _check_one_power(resolutions: dict[str, Resolution], by_id: dict[str, SlideInfo]
                     ) -> None:
    """Where a slide has no mpp, its objective power (e.g. Aperio's AppMag without MPP)
    still tells its scale: refuse slides whose power at the level tiled differs by more
    than :data:`LEVEL_TOLERANCE` (a 20x and a 40x scan tiled at level 0)."""
    powers = {}
    for s, r in resolutions.items():
        try:
            power = float(by_id[s].objective_power or "nan")
        except ValueError:  # some scanners write text
            continue
        if 0 < power < math.inf:
            powers[s] = power / r.downsample
    if len(powers) < 2:
        return
    low, high = min(powers, key=powers.__getitem__), max(powers, key=powers.__getitem__)
    if powers[high] / powers[low] - 1 > LEVEL_TOLERANCE:
        raise CapsmedError(f"{by_id[low].path}: objective power {powers[low]:g}x at level "
                           f"{resolutions[low].level}, but {by_id[high].path} is "
                           f"{powers[high]:g}x there (a slide without mpp metadata is among "
                           "them): their tiles would show tissue at different scales; "
                           "tile them into separate datasets, or give slides with mpp "
                           "metadata and --mpp")


def _refuse_copies(infos: list[SlideInfo]) -> None:
    """Refuse one slide given twice under two names (a copied file, or two files of one
    DICOM series, which OpenSlide opens as the same slide): its tiles would be written
    twice, as two slides, and could land in two splits. Slides are compared by
    OpenSlide's quickhash, plain images (no quickhash) by their bytes."""
    seen: dict[str, SlideInfo] = {}
    for info in infos:
        key = info.quickhash or file_digest(Path(info.path))
        if key in seen:
            raise CapsmedError(f"{info.path}: the same slide as {seen[key].path} (same "
                               f"{'OpenSlide quickhash' if info.quickhash else 'content'}); "
                               "its tiles would be written twice, as two slides that can "
                               "land in two splits; give only one of them")
        seen[key] = info


def _assign_splits(slide_ids: list[str], cfg: WsiConfig) -> dict[str, str]:
    return assign_splits(slide_ids, cfg.split_files, cfg.fractions, cfg.seed, unit="slide")


@claims_output
def preprocess_wsi(slides: list[Path], output: Path, config: WsiConfig,
                   disable_progress: bool | None = None, overwrite: bool = False) -> Path:
    """Tile whole-slide images into one HDF5 dataset file (atomically).

    Args:
        slides: Slide files and/or folders of slides.
        output: The ``.h5`` file to write.
        config: Tiling, labelling and split parameters (a label source is required).
        disable_progress: Hide the progress bar.
        overwrite: Replace ``output`` if it exists (otherwise that is an error).

    Returns:
        ``output``.
    """
    cfg, output = config, Path(output)
    stain = build_normaliser(cfg.stain_norm, cfg.stain_target)
    by_id: dict[str, SlideInfo] = {}
    for info in (describe_slide(p) for p in find_slides(slides)):
        if info.slide_id in by_id:
            raise CapsmedError(f"{info.path}: slide id '{info.slide_id}' (the file stem) is "
                               f"also used by {by_id[info.slide_id].path}")
        by_id[info.slide_id] = info
    resolutions = {s: choose_resolution(i, cfg) for s, i in by_id.items()}
    labelling = tile_labels.load_labels(cfg, {s: i.dimensions for s, i in by_id.items()},
                                {Path(i.path).name: s for s, i in by_id.items()})
    split_of = _assign_splits(sorted(by_id), cfg)
    ids = [s for s in sorted(by_id) if s in split_of]
    _refuse_copies([by_id[s] for s in ids])
    _check_one_scale({s: resolutions[s] for s in ids}, by_id, cfg)
    jobs, too_small = [], set()
    for s in ids:
        info, res = by_id[s], resolutions[s]
        n_rows, n_cols = (len(grid_edges(d, res, cfg)) for d in info.dimensions[::-1])
        if not n_rows or not n_cols:
            w, h = info.level_dimensions[res.level]
            log.warning("%s: the slide is %dx%d px at level %d, smaller than one %d px tile; "
                        "skipped", info.path, w, h, res.level, res.read_size)
            too_small.add(s)
            continue
        per_job = max(1, cfg.tiles_per_job // n_cols)  # whole grid rows per job
        jobs += [_Band(info, res, cfg, labelling.per_slide[s], (r, min(r + per_job, n_rows)),
                       stain) for r in range(0, n_rows, per_job)]
    workers = default_workers(cfg.workers)
    log.info("%d slide(s), %d job(s), classes %s; %d worker(s)", len(ids), len(jobs),
             ", ".join(labelling.class_names), workers)

    per_slide: dict[str, dict[str, Any]] = {s: {
        "level": resolutions[s].level, "downsample": resolutions[s].downsample,
        "read_size": resolutions[s].read_size, "mpp": resolutions[s].mpp, "tiles": 0,
        "annotations": labelling.per_slide[s].count}
        for s in ids}
    hits: dict[str, np.ndarray] = {}
    labels_of: dict[str, list[np.ndarray]] = {}
    parameters = {k: v for k, v in asdict(cfg).items() if k not in ("workers", "tiles_per_job")}
    parameters.update(
        stride_used=cfg.step, output_size_used=cfg.out_size, label_source=labelling.source,
        tissue_mask="Otsu threshold of the HSV saturation of a thumbnail (OpenCV), floored "
                    "at min_saturation; specks <= min_object_area removed, holes <= "
                    "max_hole_area filled", tile_read="openslide read_region, RGBA "
                    "composited on white", resize="cv2.INTER_AREA", split_unit="slide",
        splits=split_of, channel="hematoxylin, 255*(1-clip(H/h_max,0,1))"
        if cfg.stain == "hematoxylin" else "RGB")
    if stain is not None:
        parameters.update(stain_normalisation=stain.to_record(),
                          stain_norm_unit="each tile after resizing, before the channel")
    paths = {s: Path(by_id[s].path).resolve() for s in ids}
    raw_dir = Path(os.path.commonpath([p.parent for p in paths.values()])) if paths else Path()
    source = {"raw_dir": str(raw_dir), "slides": {s: {**asdict(by_id[s]), "path": str(paths[s])}
                                                 for s in ids},
              "annotations": labelling.files,
              "files": {**{str(p.relative_to(raw_dir)): by_id[s].file_size
                           for s, p in paths.items()}, **labelling.files}}
    # the key of a band's cached result: its slide's content and everything its labels
    # come from (a changed annotation or class list recomputes it)
    digests = {s: f"{file_digest(paths[s])}:{labelling.per_slide[s].digest()}" for s in ids}
    channels = 1 if cfg.stain == "hematoxylin" else 3
    writer = DatasetWriter(output, dataset="wsi", kind=SOURCE.name, domain=cfg.domain,
                           class_names=labelling.class_names,
                           image_shape=(channels, cfg.out_size, cfg.out_size),
                           preprocessing=parameters, source=source,
                           allow_group_leak=cfg.allow_group_leak)
    # A slide set takes long: finished bands are kept until the file is written, so an
    # interrupted run (same command) redoes only the missing bands.
    cache = ResultCache(output, {"parameters": parameters, "source": source})
    with cache, writer:
        for job, band in map_in_workers(process_band, jobs, workers=workers,
                                        description="WSI bands",
                                        disable_progress=disable_progress, cache=cache,
                                        key=lambda j: (f"{j.info.slide_id}:{j.rows}:"
                                                       f"{digests[j.info.slide_id]}"),
                                        result_type=BandResult):
            s, n = job.info.slide_id, len(band.labels)
            stats = per_slide[s]
            stats.update(band.mask, grid=[len(grid_edges(d, job.res, cfg))
                                          for d in job.info.dimensions[::-1]])
            for key, value in {**band.counts, "tiles": n}.items():
                stats[key] = stats.get(key, 0) + value
            if band.points_hit is not None:
                hits[s] = hits.get(s, band.points_hit) | band.points_hit
            labels_of.setdefault(split_of[s], []).append(band.labels)
            if n:
                writer.append(split_of[s], band.images, band.labels, [s] * n, meta={
                    "slide": np.array([s] * n), "left": band.coords[:, 0],
                    "top": band.coords[:, 1], "level": np.full(n, job.res.level, np.int32),
                    "tissue": band.tissue})
        for s, hit in hits.items():
            per_slide[s]["points_on_no_tile"] = lost = int((~hit).sum())
            if lost:
                log.warning("%s: %d of %d point annotation(s) fall on no kept tile (on glass, "
                            "below --min-tissue, or in the edge strip narrower than a tile); "
                            "their labels are not in the dataset", by_id[s].path, lost,
                            len(hit))
        for s in ids:
            if not per_slide[s]["tiles"] and s not in too_small:
                log.warning("%s: no tiles kept (tissue share %.3f)", by_id[s].path,
                            per_slide[s].get("tissue_share", 0.0))
        warn_missing_classes({split: np.concatenate(parts) for split, parts
                              in sorted(labels_of.items())}, labelling.class_names)
        _warn_empty_splits(split_of, labels_of, by_id)
        writer.update_preprocessing(per_slide=per_slide)  # known only now
    return output


def _warn_empty_splits(split_of: dict[str, str], labels_of: dict[str, list[np.ndarray]],
                       by_id: dict[str, SlideInfo]) -> None:
    """Warn about a split that was given slides but holds no tile (its slides were too
    small or showed no tissue): training or evaluating on it would find nothing."""
    for split in sorted(set(split_of.values())):
        if sum(len(p) for p in labels_of.get(split, [])) == 0:
            slides = [str(by_id[s].path) for s, where in sorted(split_of.items())
                      if where == split]
            log.warning("split '%s' holds no tile: its slide(s) %s were skipped or kept "
                        "no tiles; choose other slides for it (--split-file) or a smaller "
                        "--tile-size", split, ", ".join(slides[:3])
                        + (", ..." if len(slides) > 3 else ""))
