"""Synthetic whole-slide images: pyramidal TIFFs that OpenSlide opens, with annotations.

Real slides cannot be downloaded here, so tests and demos use slides drawn by this
module: H&E tissue islands (stroma with fibroblasts; in "tumor" slides, dense nests of
tumour nuclei) on white glass, coloured with the Beer-Lambert law and the stain vectors
of :mod:`capsmed.data.sources.tupac16.synth`. Each slide is written as a tiled, zlib-compressed
TIFF pyramid, either Aperio-style (``.svs``: an ``Aperio Image Library`` description
with ``MPP`` and ``AppMag``, a stripped thumbnail page after level 0, as real SVS
files have) or generic (``.tiff``: reduced levels marked ``subfiletype=1``, mpp in the
resolution tags). Layout written by :func:`write_wsi`::

    OUT_DIR/slides/slide_001.svs ...
    OUT_DIR/annotations/slide_001.geojson   QuPath-style FeatureCollection ("Tumor")
    OUT_DIR/points.csv                      slide,x,y,label (level-0 px; tumor / stroma)
    OUT_DIR/slide_labels.csv                slide,label (tumor / normal)
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import tifffile

from capsmed.data.sources.tupac16.synth import E_STAIN, H_STAIN
from capsmed.data.synth.histology import Canvas, draw_nucleus, fibres, sigmoid, smooth_field
from capsmed.errors import CapsmedError
from capsmed.io import atomic_dir
from capsmed.progress import track

log = logging.getLogger(__name__)

APERIO_HEADER = "Aperio Image Library v12.0.15"  # what OpenSlide's Aperio driver looks for
FORMATS = {"svs": ".svs", "tiff": ".tiff"}
TUMOR_COLOR = [200, 0, 0]  # QuPath's default colour of the "Tumor" class
_H = np.array(H_STAIN, dtype=np.float32)
_E = np.array(E_STAIN, dtype=np.float32)


@dataclass(frozen=True)
class SynthSlide:
    """One rendered slide (level 0) and the truth behind it.

    Attributes:
        rgb: (S, S, 3) uint8 image.
        tissue: (S, S) bool tissue mask.
        tumour: (S, S) bool tumour mask (inside the tissue; empty for normal slides).
        polygons: Tumour outlines, each (N, 2) float x, y (level-0 px).
    """

    rgb: np.ndarray
    tissue: np.ndarray
    tumour: np.ndarray
    polygons: tuple[np.ndarray, ...]


def _blobs(rng: np.random.Generator, size: int, count: int, centre: tuple[float, float],
           spread: float, radius: tuple[float, float]) -> np.ndarray:
    """Signed field > 0 inside ``count`` wobbly ellipses near ``centre`` (fractions)."""
    axis = (np.arange(size, dtype=np.float32) + 0.5) / size
    yy, xx = axis[:, None], axis[None, :]
    field = np.full((size, size), -np.inf, dtype=np.float32)
    for _ in range(count):
        cy, cx = np.asarray(centre) + rng.uniform(-spread, spread, 2)
        ry, rx = rng.uniform(*radius, 2)
        field = np.maximum(field, 1 - ((yy - cy) / ry) ** 2 - ((xx - cx) / rx) ** 2)
    return field + 0.3 * smooth_field(rng, (size, size), size / 8)


def render_slide(rng: np.random.Generator, size: int, tumour: bool) -> SynthSlide:
    """Draw one ``size`` x ``size`` H&E slide: tissue islands on glass, optional tumour.

    Raises:
        ValueError: ``size`` below 256.
    """
    if size < 256:
        raise ValueError(f"size must be >= 256, got {size}")
    shape = (size, size)
    field = _blobs(rng, size, int(rng.integers(1, 4)), (0.5, 0.5), 0.15, (0.15, 0.3))
    tissue = field > 0
    soft = sigmoid(field, 0.03)
    tum = np.zeros(shape, dtype=bool)
    if tumour:  # nests well inside the tissue, so their outline is a clean polygon
        inner = cv2.erode(tissue.astype(np.uint8), np.ones((size // 32 + 1,) * 2, np.uint8))
        ys, xs = np.nonzero(inner)
        k = rng.integers(len(ys))
        centre = (ys[k] / size, xs[k] / size)
        tum = (_blobs(rng, size, int(rng.integers(1, 3)), centre, 0.03, (0.06, 0.12)) > 0)
        tum &= inner.astype(bool)
    polygons = []
    contours, _ = cv2.findContours(tum.astype(np.uint8), cv2.RETR_EXTERNAL,
                                   cv2.CHAIN_APPROX_SIMPLE)
    for contour in contours:
        ring = cv2.approxPolyDP(contour, 1.5, True)[:, 0, :].astype(np.float64)
        if len(ring) >= 3 and cv2.contourArea(ring.astype(np.float32)) >= 64:
            polygons.append(ring)
    # redraw the tumour from its polygons so that annotation and image agree
    filled = np.zeros(shape, dtype=np.uint8)
    cv2.fillPoly(filled, [np.round(r).astype(np.int32) for r in polygons], 1)
    tum = filled.astype(bool)

    cv = Canvas(rng, size)
    fib = np.clip(0.5 + 0.3 * fibres(rng, shape), 0, 1)
    cv.ce[:] = soft * np.where(tum, rng.uniform(0.25, 0.35), 0.2 + 0.3 * fib)
    cv.ch[:] = soft * np.where(tum, 0.12, 0.05 + 0.02 * fib)
    density = 6e-4 * size * size + 4e-3 * tum.sum()
    for y, x in rng.uniform(0, size, (rng.poisson(density), 2)):
        iy, ix = int(y), int(x)
        in_tumour = bool(tum[iy, ix])
        # stroma keeps few nuclei; in a nest nearly every candidate becomes one
        if rng.random() < soft[iy, ix] * (0.9 if in_tumour else 0.35):
            draw_nucleus(rng, cv, y, x, tumour=in_tumour)
    ch = np.clip(cv2.GaussianBlur(cv.ch, (0, 0), 0.7), 0, 2.2)
    ce = np.clip(cv2.GaussianBlur(cv.ce, (0, 0), 0.7), 0, 1.0)
    od = ch[..., None] * _H + ce[..., None] * _E + 0.015  # + clean glass absorbs a little
    noise = 1.5 * rng.standard_normal(od.shape, dtype=np.float32)
    rgb = np.clip(np.rint(255.0 * np.exp(-od) + noise), 0, 255).astype(np.uint8)
    return SynthSlide(rgb=rgb, tissue=tissue, tumour=tum, polygons=tuple(polygons))


def write_pyramid(path: Path, rgb: np.ndarray, *, mpp: float | None = 0.25, fmt: str = "svs",
                  tile: int = 256, levels: int = 3) -> None:
    """Write ``rgb`` as a tiled TIFF pyramid (each level half the previous) OpenSlide opens.

    Args:
        path: Output file.
        rgb: (H, W, 3) uint8 level-0 image.
        mpp: Level-0 microns per pixel, or None to write no resolution metadata.
        fmt: ``svs`` (Aperio description, thumbnail page) or ``tiff`` (generic tiled
            TIFF, reduced levels as ``subfiletype=1``, mpp in the resolution tags).
        tile: TIFF tile side (a multiple of 16).
        levels: Number of pyramid levels.
    """
    if fmt not in FORMATS or tile % 16 or levels < 1:
        raise ValueError(f"bad pyramid settings: fmt={fmt!r}, tile={tile}, levels={levels}")
    h, w = rgb.shape[:2]
    pyramid = [rgb]
    for _ in range(levels - 1):
        prev = pyramid[-1]
        size = (max(1, prev.shape[1] // 2), max(1, prev.shape[0] // 2))
        pyramid.append(cv2.resize(prev, size, interpolation=cv2.INTER_AREA))
    mag = "" if mpp is None else f"|AppMag = {10 / mpp:g}|MPP = {mpp:g}"
    # zlib level 1: the noisy synthetic pixels barely compress further at higher levels
    common = {"photometric": "rgb", "compression": "zlib", "compressionargs": {"level": 1},
              "metadata": None}
    with tifffile.TiffWriter(path) as tw:
        for i, level in enumerate(pyramid):
            lh, lw = level.shape[:2]
            if fmt == "tiff":
                res = {} if mpp is None else {
                    "resolution": (1e4 / (mpp * w / lw), 1e4 / (mpp * h / lh)),
                    "resolutionunit": "CENTIMETER"}
                tw.write(level, tile=(tile, tile), subfiletype=1 if i else 0, **res, **common)
                continue
            head = (f"{w}x{h} [0,0 {w}x{h}] ({tile}x{tile}) Deflate" if i == 0
                    else f"{w}x{h} -> {lw}x{lh} - ")
            tw.write(level, tile=(tile, tile), description=f"{APERIO_HEADER} \r\n{head}{mag}",
                     **common)
            if i == 0:  # real SVS files hold a stripped thumbnail right after level 0
                scale = 256 / max(h, w)
                thumb = cv2.resize(rgb, (max(1, round(w * scale)), max(1, round(h * scale))),
                                   interpolation=cv2.INTER_AREA)
                tw.write(thumb, description=f"{APERIO_HEADER} \r\n{w}x{h} -> "
                         f"{thumb.shape[1]}x{thumb.shape[0]} - {mag}", **common)


def _feature(rng: np.random.Generator, ring: np.ndarray) -> dict:
    closed = np.vstack([ring, ring[:1]])  # GeoJSON rings repeat their first point
    return {"type": "Feature", "id": str(uuid.UUID(int=int(rng.integers(2**63)))),
            "geometry": {"type": "Polygon", "coordinates": [closed.tolist()]},
            "properties": {"objectType": "annotation",
                           "classification": {"name": "Tumor", "color": TUMOR_COLOR}}}


def _points(rng: np.random.Generator, slide: SynthSlide, count: int) -> list[tuple]:
    """``count`` tissue points: half in the tumour (when there is one), half in stroma."""
    out = []
    near = cv2.dilate(slide.tumour.astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool)
    in_tumour = count // 2 if slide.tumour.any() else 0
    for name, region, n in (("tumor", slide.tumour, in_tumour),
                            ("stroma", slide.tissue & ~near, count - in_tumour)):
        ys, xs = np.nonzero(region)
        for k in rng.choice(len(ys), size=min(n, len(ys)), replace=False) if len(ys) else []:
            out.append((int(xs[k]), int(ys[k]), name))
    return out


def write_wsi(out_dir: Path, *, slides: int = 4, size: int = 2048, seed: int = 0,
              levels: int = 3, tile: int = 256, mpp: float | None = 0.25, fmt: str = "svs",
              points_per_slide: int = 24, disable_progress: bool | None = None) -> list[Path]:
    """Write synthetic slides and their annotations to ``out_dir`` (atomically).

    Odd-numbered slides (001, 003, ...) are "tumor" slides with tumour nests outlined in
    their GeoJSON; the others are "normal" and their GeoJSON has no features.

    Args:
        out_dir: Folder to create; must not exist or be empty.
        slides: Number of slides (1-999).
        size: Level-0 side in pixels (256-16384).
        seed: Slide ``i`` is drawn from ``default_rng([seed, i])``.
        levels: Pyramid levels (each halves the previous; smallest side >= 16 px).
        tile: TIFF tile side (multiple of 16).
        mpp: Level-0 microns per pixel (None writes slides without mpp metadata).
        fmt: ``svs`` (Aperio-style) or ``tiff`` (generic tiled TIFF).
        points_per_slide: Point annotations per slide.
        disable_progress: Hide the progress bar.

    Returns:
        The slide paths as they are after the folder is in place.
    """
    out_dir = Path(out_dir)
    problems = [(not 1 <= slides <= 999, f"slides must be 1-999, got {slides}"),
                (not 256 <= size <= 16384, f"size must be 256-16384, got {size}"),
                (seed < 0, f"seed must be >= 0, got {seed}"),
                (levels < 1 or size >> (levels - 1) < 16, f"levels must be >= 1 and leave "
                 f"the smallest level >= 16 px, got {levels}"),
                (tile < 16 or tile % 16, f"tile must be a positive multiple of 16, got {tile}"),
                (mpp is not None and not mpp > 0, f"mpp must be > 0, got {mpp}"),
                (fmt not in FORMATS, f"format must be svs or tiff, got {fmt!r}"),
                (points_per_slide < 0, "points_per_slide must be >= 0")]
    for bad, message in problems:
        if bad:
            raise CapsmedError(f"{out_dir}: {message}")
    names = [f"slide_{i:03d}" for i in range(1, slides + 1)]
    points: list[str] = ["slide,x,y,label\n"]
    labels: list[str] = ["slide,label\n"]
    with atomic_dir(out_dir) as tmp:
        (tmp / "slides").mkdir()
        (tmp / "annotations").mkdir()
        for i, name in enumerate(track(names, "Synthesising slides", disable=disable_progress)):
            rng = np.random.default_rng([seed, i + 1])
            slide = render_slide(rng, size, tumour=i % 2 == 0)
            write_pyramid(tmp / "slides" / f"{name}{FORMATS[fmt]}", slide.rgb, mpp=mpp,
                          fmt=fmt, tile=tile, levels=levels)
            collection = {"type": "FeatureCollection",
                          "features": [_feature(rng, r) for r in slide.polygons]}
            (tmp / "annotations" / f"{name}.geojson").write_text(
                json.dumps(collection), encoding="utf-8")
            points += [f"{name},{x},{y},{lab}\n" for x, y, lab in
                       _points(rng, slide, points_per_slide)]
            labels.append(f"{name},{'tumor' if slide.polygons else 'normal'}\n")
        (tmp / "points.csv").write_text("".join(points), encoding="utf-8")
        (tmp / "slide_labels.csv").write_text("".join(labels), encoding="utf-8")
    log.info("wrote %d synthetic %s slides (%d px, %d levels) to %s", slides, fmt, size,
             levels, out_dir)
    return [out_dir / "slides" / f"{n}{FORMATS[fmt]}" for n in names]
