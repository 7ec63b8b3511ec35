"""Whole-slide image reading: open any slide, describe it, read tiles.

:func:`open_slide` is a reader factory in the spirit of TIAToolbox's ``WSIReader.open``:
``openslide.open_slide`` picks the vendor driver (svs, ndpi, mrxs, generic tiled TIFF,
...) and falls back to ``ImageSlide`` (Pillow) for plain TIFF/PNG. Every failure is one
line naming the file.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from capsmed.data.files import FolderWalk, check_file
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)

SLIDE_SUFFIXES = (".svs", ".tif", ".tiff", ".ndpi", ".vms", ".vmu", ".scn", ".mrxs",
                  ".svslide", ".bif", ".dcm", ".png", ".jpg", ".jpeg")

# Pillow modes of more than 8 bits a sample: ImageSlide's read_region clips them to 8
DEEP_MODES = {"I;16": "16-bit grey", "I;16B": "16-bit grey", "I;16L": "16-bit grey",
              "I;16N": "16-bit grey", "I": "32-bit integer", "F": "floating-point"}


ANISOTROPY_TOLERANCE = 0.01  # mpp-x and mpp-y this close (relative) are square pixels


@dataclass(frozen=True)
class SlideInfo:
    """What a slide says about itself (all of it is recorded in the dataset file)."""

    path: str
    slide_id: str
    reader: str
    vendor: str | None
    dimensions: tuple[int, int]
    level_dimensions: tuple[tuple[int, int], ...]
    level_downsamples: tuple[float, ...]
    mpp: float | None
    mpp_xy: tuple[float, float] | None
    objective_power: str | None
    file_size: int
    quickhash: str | None


@dataclass(frozen=True)
class Resolution:
    """Where tiles are read: ``level``, level-0 pixels per tile pixel, region size read."""

    level: int
    downsample: float
    read_size: int
    mpp: float | None

    def footprint(self, tile_size: int) -> float:
        return tile_size * self.downsample


def open_slide(path: Path) -> Any:
    """Open any slide OpenSlide or Pillow reads, or fail with one line naming the file."""
    import openslide
    from PIL import Image

    path = Path(path)
    if not path.is_file():
        raise CapsmedError(f"{path}: no such slide file")
    try:
        slide = openslide.open_slide(str(path))
        if isinstance(slide, openslide.ImageSlide):
            with Image.open(path) as image:
                mode = image.mode
            if mode in DEEP_MODES:  # Pillow's RGBA conversion clips these at 255
                slide.close()
                raise CapsmedError(f"{path}: a {DEEP_MODES[mode]} plain image, whose "
                                   "values the slide reader would clip at 255; save it as "
                                   "8-bit or as a pyramidal TIFF")
        return slide
    except Image.DecompressionBombError as exc:
        raise CapsmedError(f"{path}: plain image too large for Pillow; convert it to a "
                           f"pyramidal TIFF ({exc})") from None
    except (openslide.OpenSlideError, OSError, ValueError) as exc:
        raise CapsmedError(f"{path}: cannot open slide: neither OpenSlide nor Pillow reads "
                           f"it ({type(exc).__name__}: {exc})") from None


def _positive(value: str | None) -> float | None:
    """A property as a positive float, else None (some scanners write 0 or text)."""
    try:
        number = float(value) if value is not None else 0.0
    except ValueError:
        return None
    return number if number > 0 and math.isfinite(number) else None


def describe_slide(path: Path) -> SlideInfo:
    """Open a slide once and read its dimensions, levels, mpp and vendor."""
    path = Path(path)
    with open_slide(path) as slide:
        props = dict(slide.properties)
        mx, my = _positive(props.get("openslide.mpp-x")), _positive(props.get("openslide.mpp-y"))
        mpp_xy = None if mx is None else (mx, my or mx)
        if mpp_xy and abs(mpp_xy[0] - mpp_xy[1]) > ANISOTROPY_TOLERANCE * min(mpp_xy):
            log.warning("%s: non-square pixels (mpp %s x %s); using their mean", path, *mpp_xy)
        return SlideInfo(
            path=str(path), slide_id=path.stem, reader=type(slide).__name__,
            vendor=props.get("openslide.vendor"),
            dimensions=tuple(int(v) for v in slide.dimensions),
            level_dimensions=tuple(tuple(int(v) for v in d) for d in slide.level_dimensions),
            level_downsamples=tuple(float(d) for d in slide.level_downsamples),
            mpp=None if mpp_xy is None else sum(mpp_xy) / 2, mpp_xy=mpp_xy,
            objective_power=props.get("openslide.objective-power"),
            file_size=path.stat().st_size, quickhash=props.get("openslide.quickhash-1"))


def square_mpp(info: SlideInfo, asked: float) -> float:
    """The (known) slide's level-0 microns per pixel for ``--mpp asked``, refusing non-square
    pixels: a square tile read there would be another size across than down, and
    neither side at the mpp asked (0.25 x 0.5 um/px at --mpp 0.5: 0.33 x 0.66)."""
    mx, my = info.mpp_xy or (info.mpp, info.mpp)
    if abs(mx - my) > ANISOTROPY_TOLERANCE * min(mx, my):
        raise CapsmedError(f"{info.path}: --mpp {asked} asked but the slide's pixels are not "
                           f"square ({mx:.4g} x {my:.4g} um/px); square tiles read from it "
                           "would be at neither; use --level instead")
    return info.mpp


def tissue_fractions(mask: np.ndarray, dims0: tuple[int, int], xs: np.ndarray,
                     ys: np.ndarray, footprint: float) -> np.ndarray:
    """Share of mask pixels under each grid tile -> float [len(ys), len(xs)]."""
    mh, mw = mask.shape
    sx, sy = mw / dims0[0], mh / dims0[1]
    integral = np.pad(mask.astype(np.int64), ((1, 0), (1, 0))).cumsum(0).cumsum(1)

    def bounds(edges: np.ndarray, scale: float, size: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = np.round(edges * scale), np.round((edges + footprint) * scale)
        # a tile narrower than a mask pixel can round to no pixel, or to its neighbour's:
        # it takes the pixel under its centre
        lo = np.where(hi <= lo, np.floor((edges + footprint / 2) * scale), lo)
        lo = np.clip(lo, 0, size - 1).astype(np.int64)
        hi = np.clip(hi, lo + 1, size).astype(np.int64)
        return lo, hi

    x0, x1 = bounds(xs, sx, mw)
    y0, y1 = bounds(ys, sy, mh)
    total = (integral[y1][:, x1] - integral[y0][:, x1] - integral[y1][:, x0]
             + integral[y0][:, x0])
    return total / ((y1 - y0)[:, None] * (x1 - x0)[None, :])


def on_white(region: Any) -> np.ndarray:
    """An RGBA region (what ``read_region`` returns) as RGB uint8 composited on white:
    OpenSlide gives transparent pixels outside the scanned area."""
    rgba = np.asarray(region, dtype=np.uint16)
    alpha = rgba[..., 3:4]
    return ((rgba[..., :3] * alpha + 255 * (255 - alpha) + 127) // 255).astype(np.uint8)


def read_tile(slide: Any, x: int, y: int, res: Resolution, out_size: int) -> np.ndarray:
    """One tile as RGB uint8 (out_size, out_size, 3); transparent pixels become white."""
    rgb = on_white(slide.read_region((int(x), int(y)), res.level,
                                     (res.read_size, res.read_size)))
    if res.read_size != out_size:
        rgb = cv2.resize(rgb, (out_size, out_size), interpolation=cv2.INTER_AREA)
    return rgb


def find_slides(inputs: list[Path]) -> list[Path]:
    """Slide files from files and folders (a folder contributes its known slide types)."""
    out: list[Path] = []
    for given in map(Path, inputs):
        if given.is_dir():
            found = FolderWalk().files(given, SLIDE_SUFFIXES, recursive=False)
            if not found:
                raise CapsmedError(f"{given}: no slide files in this folder (looked for "
                                   f"{', '.join(SLIDE_SUFFIXES)})")
            out += found
        elif given.is_file():
            out.append(check_file(given, "slide file"))
        else:
            if given.is_symlink():
                check_file(given, "slide file or folder")  # a broken link or a loop
            raise CapsmedError(f"{given}: no such slide file or folder")
    return list(dict.fromkeys(out))
