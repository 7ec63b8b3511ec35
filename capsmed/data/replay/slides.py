"""Slides read for replayed recipes: which inputs are whole slides, the pyramid level a
patch-level run reads, and :class:`SlideWindows`, a patch-level recipe (TUPAC16) over a
whole slide region by region.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from capsmed.data.patches import grid_centres, window_fraction
from capsmed.data.replay.options import Overrides
from capsmed.data.replay.windows import CHUNK, THUMBNAIL_SIDE, Prepared, check_centres
from capsmed.data.slides import SlideInfo, describe_slide, on_white, open_slide, square_mpp
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)


REGION = 2048  # side (level px) of the slide regions a patch-level run reads at a time
SCALE_TOLERANCE = 0.25  # a read mpp this far (relative) from the training one is warned
BLUR_MARGIN = 8  # the tissue mask's box blur (15 px) reaches 7 px beyond a window
TISSUE_OD = 0.15  # capsmed.data.stains.tissue_mask's optical-density threshold


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
    one of them holds at least that mean density, which :func:`od_bound` bounds from
    above. With ``needed`` 0 every window is kept: nothing is blank (the caller reads
    every region).
    """
    return TISSUE_OD * needed * size ** 2 / (size + 14 + 2 * block) ** 2


def od_bound(picture: np.ndarray) -> np.ndarray:
    """The most mean optical density (:data:`TISSUE_OD`'s formula) the pixels behind
    each thumbnail pixel of ``picture`` (RGB uint8, each the mean of its block, rounded)
    can hold. Not the density of the mean colour: the density is convex in the value,
    so a block of dark specks on white holds far more density than its pale mean shows
    (one black pixel in each 4x4 block: mean 239, density 0.065, yet 0.35 is there).
    The chord from (0, log 256) to (255, 0) lies above the curve, so the density of a
    block of mean ``v`` is at most ``log(256) * (255 - v) / 255`` per channel; half a
    value more for the rounding."""
    darkness = (255.5 - picture.astype(np.float32)).mean(axis=-1)
    return np.float32(np.log(256.0) / 255.0) * darkness


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
    mpp = square_mpp(info, overrides.mpp)
    for level, ds in enumerate(info.level_downsamples):
        if abs(mpp * ds / overrides.mpp - 1) <= 0.01:
            return level
    shown = ", ".join(f"{info.mpp * d:.3g}" for d in info.level_downsamples)
    raise CapsmedError(f"{info.path}: no level at {overrides.mpp} um/px (levels: {shown})")


def _refuse_one_window_twice(path: Path, xy: np.ndarray, rc: np.ndarray, level: int,
                             ds: float) -> None:
    """Refuse given level-0 centres ``xy`` that fall on one pixel ``rc`` of the level
    read: the same window would be scored twice, two identical rows and features."""
    _, first, inverse = np.unique(rc, axis=0, return_index=True, return_inverse=True)
    again = np.flatnonzero(first[inverse.reshape(-1)] != np.arange(len(rc)))
    if len(again):
        (x1, y1), (x2, y2) = xy[first[inverse.reshape(-1)[again[0]]]], xy[again[0]]
        raise CapsmedError(f"{path}: centres x={x1}, y={y1} and x={x2}, y={y2} are one "
                           f"window at level {level} (a pixel there is {ds:g} level-0 px); "
                           "it would be scored twice: give one of them")


def _region_order(rc: np.ndarray) -> np.ndarray:
    """The order windows centred on ``rc`` (level px) are read in: regions row-major,
    the given (grid) order inside each (a stable sort)."""
    key = rc // REGION
    return np.lexsort((key[:, 1], key[:, 0]))


def _as_given(chunks: Iterator[tuple[np.ndarray, np.ndarray]], rc: np.ndarray
              ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Given centres' windows, cut region by region, handed on in the order given (as
    on a plain image), so predictions.csv lists them as the centres CSV does."""
    parts = list(chunks)  # every given window is cut: none is dropped for its tissue
    if not parts:
        return
    images = np.concatenate([p for p, _ in parts])
    xy = np.concatenate([c for _, c in parts])
    back = np.argsort(_region_order(rc), kind="stable")
    for start in range(0, len(back), CHUNK):
        part = back[start:start + CHUNK]
        yield images[part], xy[part]


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
        if given:
            xy = check_centres(path, centres, w0, h0, what="slide")
            rc = np.round(xy[:, ::-1] / ds).astype(np.int64).clip(0, [h - 1, w - 1])
            _refuse_one_window_twice(path, xy, rc, level, ds)
        else:
            rc = grid_centres(h, w, size, self.recipe.stride)
        scale = min(1.0, THUMBNAIL_SIDE / max(w0, h0))
        with open_slide(path) as slide:
            picture = np.asarray(slide.get_thumbnail(
                (max(1, round(w0 * scale)), max(1, round(h0 * scale)))).convert("RGB"))
        # where a region may hold tissue, only to skip blank ones (the recipe's mask decides)
        needed = self.recipe.min_share()
        tissue = (od_bound(picture) > blank_od(size, needed, w / picture.shape[1])
                  if needed > 0 else np.ones(picture.shape[:2], dtype=bool))
        notes = {"level": level, "downsample": ds, "mpp": None if info.mpp is None
                 else info.mpp * ds, "region": REGION}
        record = self.recipe.record
        notes.update(scale_note(path, notes["mpp"], record.data_source().scan_mpp,
                                f"this run's images (dataset {record.dataset!r})"))
        chunks = self._regions(path, rc, level, ds, tissue, not given, (w, h))
        return Prepared(size=(w0, h0), footprint=size * ds,
                        chunks=_as_given(chunks, rc) if given else chunks,
                        expected=len(rc) if given else None, thumbnail=picture, notes=notes)

    def _regions(self, path: Path, rc: np.ndarray, level: int, ds: float,
                 tissue: np.ndarray, select: bool, extent: tuple[int, int]
                 ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        import openslide

        w, h = extent
        margin = self.recipe.size // 2 + 1 + BLUR_MARGIN
        order = _region_order(rc)
        rc, key = rc[order], rc[order] // REGION
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
