"""Whole-slide prediction: the tile grid of ``capsmed preprocess wsi``, replayed.

The slide is opened by the same reader factory, its tissue mask made from a thumbnail
with the recorded parameters, the grid laid at the recorded level or mpp (``--level``
/ ``--mpp`` override it) and every tissue tile read, resized and stained exactly as the
training tiles were. Tiles are read chunk by chunk, so a slide never sits in memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from capsmed.data.patches import grid_centres, window_fraction
from capsmed.data.record import DatasetRecord
from capsmed.data.slides import (
    Resolution,
    SlideInfo,
    describe_slide,
    on_white,
    open_slide,
    tissue_fractions,
)
from capsmed.data.sources.wsi.config import WsiConfig
from capsmed.data.sources.wsi.reader import (
    choose_resolution,
    grid_edges,
    read_tiles,
    slide_mask,
)
from capsmed.errors import CapsmedError
from capsmed.predict.config import Overrides
from capsmed.predict.windows import CHUNK, THUMBNAIL_SIDE, Prepared, check_centres

log = logging.getLogger(__name__)


def wsi_config(record: DatasetRecord, overrides: Overrides) -> WsiConfig:
    """The recorded tiling parameters, with the user's overrides."""
    known = {f.name for f in fields(WsiConfig)}
    given = {k: tuple(v) if isinstance(v, list) else v
             for k, v in record.preprocessing.items() if k in known}
    try:
        cfg = WsiConfig(**given)
        if overrides.level is not None or overrides.mpp is not None:
            cfg = replace(cfg, level=overrides.level, mpp=overrides.mpp)
        if overrides.stride is not None:
            cfg = replace(cfg, stride=overrides.stride)
        if overrides.min_tissue is not None:
            cfg = replace(cfg, min_tissue=overrides.min_tissue)
    except CapsmedError as exc:
        raise CapsmedError(f"{record.origin}: {exc}") from None
    return cfg


class SlideTiles:
    """Tiles of a whole slide (or of a plain image opened as one), as in training."""

    windowed = True
    slides = True

    def __init__(self, record: DatasetRecord, overrides: Overrides) -> None:
        self.cfg = wsi_config(record, overrides)
        self.given_stride = overrides.stride is not None
        self.trained_mpp = training_mpp(record)

    def prepare(self, path: Path, centres: np.ndarray | None) -> Prepared:
        cfg = self.cfg
        info = describe_slide(path)
        res = choose_resolution(info, cfg)
        footprint = res.footprint(cfg.tile_size)
        mask, threshold = slide_mask(info, cfg)
        if centres is None:
            xs = grid_edges(info.dimensions[0], res, cfg)
            ys = grid_edges(info.dimensions[1], res, cfg)
            frac = tissue_fractions(mask, info.dimensions, xs, ys, footprint)
            rows, cols = np.nonzero(frac >= cfg.min_tissue)  # top to bottom, left to right
            lefts = np.stack([xs[cols], ys[rows]], axis=1).astype(np.int64).reshape(-1, 2)
        else:
            xy = check_centres(path, centres, *info.dimensions, what="slide")
            lefts = np.round(xy - footprint / 2).astype(np.int64)
        w0, h0 = info.dimensions
        scale = min(1.0, THUMBNAIL_SIDE / max(w0, h0))
        with open_slide(path) as slide:
            picture = np.asarray(slide.get_thumbnail(
                (max(1, round(w0 * scale)), max(1, round(h0 * scale)))).convert("RGB"))
        notes = {"level": res.level, "downsample": res.downsample, "mpp": res.mpp,
                 "read_size": res.read_size, "tile_size": cfg.tile_size,
                 "stride": cfg.step, "min_tissue": cfg.min_tissue,
                 "mask_threshold": threshold, "tissue_share": float(mask.mean()),
                 "training_mpp": self.trained_mpp,
                 **scale_note(path, res.mpp, self.trained_mpp, "the run's training tiles")}
        return Prepared(size=(w0, h0), footprint=footprint,
                        chunks=self._tiles(path, lefts, res, footprint),
                        expected=len(lefts), thumbnail=picture, notes=notes)

    def _tiles(self, path: Path, lefts: np.ndarray, res: Resolution, footprint: float
               ) -> Iterator[tuple[np.ndarray, np.ndarray]]:

        with open_slide(path) as slide:
            for start in range(0, len(lefts), CHUNK):
                part = lefts[start:start + CHUNK]
                yield (read_tiles(slide, path, part, res, self.cfg),
                       np.round(part + footprint / 2).astype(np.int64))


REGION = 2048  # side (level px) of the slide regions a patch-level run reads at a time
TRAINING_MPP = {"tupac16": 0.25}  # the sources' scanning resolution (TUPAC16: 40x)
SCALE_TOLERANCE = 0.25  # a read mpp this far (relative) from the training one is warned
BLUR_MARGIN = 8  # the tissue mask's box blur (15 px) reaches 7 px beyond a window
TISSUE_OD = 0.15  # capsmed.data.stains.tissue_mask's optical-density threshold


def training_mpp(record: DatasetRecord) -> float | None:
    """The microns per pixel a ``wsi`` run's tiles were read at (the median over its
    slides, from the record's ``per_slide``), or None where unrecorded."""
    per_slide = record.preprocessing.get("per_slide") or {}
    known = [s["mpp"] for s in per_slide.values() if isinstance(s, dict) and s.get("mpp")]
    return float(np.median(known)) if known else None


def scale_note(path: Path, mpp: float | None, trained: float | None, what: str
               ) -> dict[str, str]:
    """Warn (and say so in the input's notes) when a slide is read at a resolution more
    than :data:`SCALE_TOLERANCE` away from the one the model was trained at."""
    if not mpp or not trained or abs(mpp / trained - 1) <= SCALE_TOLERANCE:
        return {}
    message = (f"read at {mpp:.3g} um/px, but {what} are {trained:.3g} um/px; the model "
               "sees cells at another scale (choose --level or --mpp)")
    log.warning("%s: %s", path, message)
    return {"scale_warning": message}


def blank_od(size: int, needed: float, block: float) -> float:
    """The most optical density (the thumbnail's, of :data:`TISSUE_OD`'s formula) a
    slide region may show and hold no window the recipe keeps.

    A kept window (``size`` px) has a share ``needed`` of pixels whose blurred density
    exceeds :data:`TISSUE_OD`; the blur moves density at most 7 px, so the window grown
    by 7 px holds density ``TISSUE_OD * needed * size**2``, and the thumbnail pixels
    (``block`` level px each) over it cover at most ``(size + 14 + 2 * block)**2`` px:
    one of them shows at least that density over that area (a thumbnail pixel is the
    mean of its block). With ``needed`` 0 every window is kept: nothing is blank.
    """
    return TISSUE_OD * needed * size ** 2 / (size + 14 + 2 * block) ** 2
SLIDE_ONLY = (".svs", ".ndpi", ".vms", ".vmu", ".scn", ".mrxs", ".svslide", ".bif", ".dcm")


def is_slide(path: Path) -> bool:
    """A whole-slide file: a vendor format, or a TIFF with a pyramid (plain TIFF images,
    such as TUPAC16's, are read whole)."""
    suffix = path.suffix.lower()
    if suffix in SLIDE_ONLY:
        return True
    if suffix not in (".tif", ".tiff"):
        return False
    import tifffile

    try:
        with tifffile.TiffFile(path) as tif:
            return len(tif.series[0].levels) > 1
    except Exception:  # a corrupt TIFF: the image reader reports it
        return False


def _level(info: SlideInfo, overrides: Overrides) -> int:
    """The pyramid level a patch-level run reads: ``--level``, the level at ``--mpp``
    (within 1%; patch runs do not resample), else 0."""
    if overrides.level is not None:
        if overrides.level >= len(info.level_downsamples):
            raise CapsmedError(f"{info.path}: level {overrides.level} asked but the slide has "
                               f"{len(info.level_downsamples)} level(s)")
        return overrides.level
    if overrides.mpp is None:
        return 0
    if info.mpp is None:
        raise CapsmedError(f"{info.path}: --mpp given but the slide has no microns-per-pixel "
                           "metadata; use --level")
    for level, ds in enumerate(info.level_downsamples):
        if abs(info.mpp * ds / overrides.mpp - 1) <= 0.01:
            return level
    shown = ", ".join(f"{info.mpp * d:.3g}" for d in info.level_downsamples)
    raise CapsmedError(f"{info.path}: no level at {overrides.mpp} um/px (levels: {shown})")


class SlideWindows:
    """A patch-level recipe (TUPAC16) over a whole slide, region by region.

    The slide is read at one level in :data:`REGION` px regions with a margin, and each
    region goes through the recipe's own channel and tissue mask, so a window's pixels
    are what the image recipe would cut from the same pixels. A region is not read only
    where the slide's thumbnail is too pale to hold a window the recipe's mask keeps
    (:func:`blank_od`).
    """

    def __init__(self, recipe: Any, overrides: Overrides) -> None:
        self.recipe, self.overrides = recipe, overrides

    def prepare(self, path: Path, centres: np.ndarray | None) -> Prepared:
        info = describe_slide(path)
        level = _level(info, self.overrides)
        ds = info.level_downsamples[level]
        w, h = info.level_dimensions[level]
        size = self.recipe.size
        if w < size or h < size:
            raise CapsmedError(f"{path}: level {level} is {w}x{h} px, smaller than one "
                               f"{size} px window")
        given = centres is not None
        w0, h0 = info.dimensions
        rc = (np.round(check_centres(path, centres, w0, h0, what="slide")[:, ::-1] / ds)
              .astype(np.int64).clip(0, [h - 1, w - 1])
              if given else grid_centres(h, w, size, self.recipe.stride))
        scale = min(1.0, THUMBNAIL_SIDE / max(w0, h0))
        with open_slide(path) as slide:
            picture = np.asarray(slide.get_thumbnail(
                (max(1, round(w0 * scale)), max(1, round(h0 * scale)))).convert("RGB"))
        # where a region may hold tissue, only to skip blank ones (the recipe's mask decides)
        od = -np.log((picture.astype(np.float32) + 1.0) / 256.0).mean(axis=-1)
        tissue = od > blank_od(size, self.recipe.min_share(), w / picture.shape[1])
        notes = {"level": level, "downsample": ds, "mpp": None if info.mpp is None
                 else info.mpp * ds, "region": REGION}
        dataset = self.recipe.record.dataset
        notes.update(scale_note(path, notes["mpp"], TRAINING_MPP.get(dataset),
                                f"{dataset} images"))
        return Prepared(size=(w0, h0), footprint=size * ds,
                        chunks=self._regions(path, rc, level, ds, tissue, not given, (w, h)),
                        expected=None, thumbnail=picture, notes=notes)

    def _regions(self, path: Path, rc: np.ndarray, level: int, ds: float,
                 tissue: np.ndarray, select: bool, extent: tuple[int, int]
                 ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        import openslide

        w, h = extent
        margin = self.recipe.size // 2 + 1 + BLUR_MARGIN
        key = rc // REGION
        order = np.lexsort((key[:, 1], key[:, 0]))  # regions row-major, grid order inside
        rc, key = rc[order], key[order]
        starts = np.flatnonzero(np.r_[True, (np.diff(key, axis=0) != 0).any(axis=1)])
        ty, tx = tissue.shape[0] / h, tissue.shape[1] / w
        with open_slide(path) as slide:
            for begin, end in zip(starts, [*starts[1:], len(rc)], strict=True):
                top, left = (key[begin] * REGION - margin).tolist()
                top, left = max(top, 0), max(left, 0)
                bottom = min((key[begin][0] + 1) * REGION + margin, h)
                right = min((key[begin][1] + 1) * REGION + margin, w)
                seen = tissue[int(top * ty):int(np.ceil(bottom * ty)),
                              int(left * tx):int(np.ceil(right * tx))]
                if select and not seen.any():
                    continue
                try:
                    region = slide.read_region((round(left * ds), round(top * ds)), level,
                                               (right - left, bottom - top))
                except (openslide.OpenSlideError, OSError, ValueError) as exc:
                    raise CapsmedError(f"{path}: cannot read the region at x={left}, "
                                       f"y={top}, level {level} ({type(exc).__name__}: "
                                       f"{exc})") from None
                channel, mask, needed, _ = self.recipe.channel_and_mask(path, on_white(region))
                local = rc[begin:end] - [top, left]
                if select:
                    local = local[window_fraction(mask, local, self.recipe.size) >= needed]
                if len(local):
                    xy = local[:, ::-1] + [left, top]
                    yield (self.recipe.cut(channel, local[:, ::-1].copy()),
                           np.round(xy * ds).astype(np.int64))
