"""Tile labels from whole-slide annotations (read by :mod:`.annotations`).

* points: a tile takes the class of a point inside its footprint (the point nearest
  the tile centre when several are);
* polygons: a tile takes the class of the polygon covering its centre, or with a
  minimum overlap, the class covering the largest share of the tile. Where polygons
  overlap the smallest one wins, so a "Necrosis" region drawn inside a "Tumor" region
  labels the tiles inside it, as QuPath's annotation hierarchy intends;
* slide labels: every tile takes its slide's class.

:func:`load_labels` reads the label source a ``WsiConfig`` names and checks it against
the slides.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from capsmed.data.sources.wsi.annotations import (
    PointSet,
    Polygon,
    match_geojson,
    read_geojson,
    read_points_csv,
    read_slide_labels,
)
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)


def point_labels(xs: np.ndarray, ys: np.ndarray, keep: np.ndarray, footprint: float,
                 points: PointSet, class_index: Mapping[str, int]
                 ) -> tuple[np.ndarray, int, np.ndarray]:
    """Label a tile grid with the points inside each kept tile's footprint.

    Args:
        xs, ys: Level-0 left / top edges of the grid's columns and rows (sorted).
        keep: bool [len(ys), len(xs)]: the tiles kept (enough tissue).
        footprint: Tile side in level-0 pixels; a tile covers ``[x, x + footprint)``.
        points: The slide's point annotations.
        class_index: Class name -> label index.

    Returns:
        Label grid int64 [len(ys), len(xs)] (-1 where no point falls), the number of
        tiles holding points of two classes, and which points fell on a kept tile.
    """
    labels = np.full(keep.shape, -1, dtype=np.int64)
    best = np.full(keep.shape, np.inf)
    seen: dict[tuple[int, int], set[int]] = {}
    hit = np.zeros(len(points.labels), dtype=bool)
    for i, ((px, py), name) in enumerate(zip(points.xy, points.labels, strict=True)):
        # columns with x <= px < x + footprint, rows likewise
        c0, c1 = np.searchsorted(xs, px - footprint, "right"), np.searchsorted(xs, px, "right")
        r0, r1 = np.searchsorted(ys, py - footprint, "right"), np.searchsorted(ys, py, "right")
        rows, cols = (g.ravel() for g in np.mgrid[r0:r1, c0:c1])
        on = keep[rows, cols]
        rows, cols = rows[on], cols[on]
        if not len(rows):
            continue
        hit[i] = True
        k = class_index[name]
        dist = (xs[cols] + footprint / 2 - px) ** 2 + (ys[rows] + footprint / 2 - py) ** 2
        for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
            seen.setdefault((r, c), set()).add(k)
        closer = dist < best[rows, cols]  # the point nearest the tile centre wins
        best[rows[closer], cols[closer]] = dist[closer]
        labels[rows[closer], cols[closer]] = k
    return labels, sum(len(v) > 1 for v in seen.values()), hit


def polygon_labels(boxes: np.ndarray, footprint: float, polygons: tuple[Polygon, ...],
                   class_index: Mapping[str, int], min_overlap: float | None,
                   samples: int = 8) -> np.ndarray:
    """Label tiles (level-0 top-left corners ``boxes`` (T, 2) as x, y) from polygons.

    Without ``min_overlap`` a tile takes the class of the (smallest) polygon covering
    its centre. With it, ``samples`` x ``samples`` points spread over the tile estimate
    each class's share, and the tile takes the largest class if its share is at least
    ``min_overlap``. Returns int64 [T], -1 for unlabelled tiles.
    """
    from skimage.measure import points_in_poly

    n = len(boxes)
    if n == 0 or not polygons:
        return np.full(n, -1, dtype=np.int64)
    s = 1 if min_overlap is None else samples
    offsets = (np.arange(s) + 0.5) / s * footprint
    grid = np.stack(np.meshgrid(offsets, offsets), axis=-1).reshape(-1, 2)  # (s*s, 2) x, y
    pts = (boxes[:, None, :].astype(np.float64) + grid[None]).reshape(-1, 2)
    owner = np.full(len(pts), -1, dtype=np.int64)
    owner_area = np.full(len(pts), np.inf)
    for poly in polygons:
        lo, hi = poly.exterior.min(axis=0), poly.exterior.max(axis=0)
        cand = np.flatnonzero(((pts >= lo) & (pts <= hi)).all(axis=1)
                              & (poly.area < owner_area))
        if not len(cand):
            continue
        inside = points_in_poly(pts[cand], poly.exterior)
        for hole in poly.holes:
            inside &= ~points_in_poly(pts[cand], hole)
        owner[cand[inside]] = class_index[poly.label]
        owner_area[cand[inside]] = poly.area
    owner = owner.reshape(n, s * s)
    if s == 1:
        return owner[:, 0]
    counts = np.stack([(owner == k).sum(axis=1) for k in range(len(class_index))], axis=1)
    best = counts.argmax(axis=1)
    share = counts[np.arange(n), best] / (s * s)
    return np.where(share >= min_overlap - 1e-9, best, -1).astype(np.int64)


@dataclass(frozen=True)
class SlideLabels:
    """How the tiles of one slide get labels (picklable: it travels to a worker)."""

    mode: str  # "points", "polygons" or "slide"
    class_index: dict[str, int]
    slide_label: int = -1
    points: PointSet | None = None
    polygons: tuple[Polygon, ...] = ()
    min_overlap: float | None = None

    @property
    def count(self) -> int:
        """Number of annotations (points or polygons) this slide has."""
        return len(self.points.labels) if self.points is not None else len(self.polygons)

    def digest(self) -> str:
        """SHA-256 of everything that decides the slide's tile labels (its annotations,
        the class index, the slide's label): part of each cached band result's key."""
        h = hashlib.sha256(json.dumps([self.mode, self.class_index, self.slide_label,
                                       self.min_overlap], sort_keys=True).encode())
        if self.points is not None:
            h.update(np.ascontiguousarray(self.points.xy, dtype=np.float64).tobytes())
            h.update("\n".join(self.points.labels).encode())
        for poly in self.polygons:
            h.update(poly.label.encode())
            for ring in (poly.exterior, *poly.holes):
                h.update(np.ascontiguousarray(ring, dtype=np.float64).tobytes())
        return h.hexdigest()[:16]

    def label_tiles(self, xs: np.ndarray, ys: np.ndarray, keep: np.ndarray,
                    coords: np.ndarray, footprint: float
                    ) -> tuple[np.ndarray, dict[str, int], np.ndarray | None]:
        """Labels (-1 = unlabelled) of the kept tiles of a grid (``coords`` = their
        corners), counts to record, and for points which of them fell on a kept tile."""
        if self.mode == "slide":
            return np.full(len(coords), self.slide_label, dtype=np.int64), {}, None
        if self.mode == "polygons":
            return polygon_labels(coords, footprint, self.polygons, self.class_index,
                                  self.min_overlap), {}, None
        if self.points is None:
            return np.full(len(coords), -1, dtype=np.int64), {}, np.zeros(0, dtype=bool)
        grid, mixed, hit = point_labels(xs, ys, keep, footprint, self.points, self.class_index)
        rows, cols = np.nonzero(keep)
        return grid[rows, cols], {"tiles_with_two_point_classes": mixed}, hit


@dataclass(frozen=True)
class Labelling:
    """The label source of a run: class names, per-slide labellers, files read."""

    source: str
    class_names: list[str]
    per_slide: dict[str, SlideLabels]
    files: dict[str, int]


EDGE_SLACK = 0.01  # a polygon may overrun the slide by this share of its size


def _check_polygons_fit(path: Path, slide: str, shapes: tuple[Polygon, ...],
                        size: tuple[int, int]) -> None:
    """Refuse polygons that reach past the slide: exported at another scale, or for
    another slide, they would label no tile and the slide's tiles would all be
    background."""
    w, h = size
    slack = EDGE_SLACK * np.array([w, h])
    for number, shape in enumerate(shapes, start=1):
        lo, hi = shape.exterior.min(axis=0), shape.exterior.max(axis=0)
        if (lo < -slack).any() or (hi > np.array([w, h]) + slack).any():
            raise CapsmedError(
                f"{path}: polygon {number} ({shape.label!r}) spans x {lo[0]:g}..{hi[0]:g}, "
                f"y {lo[1]:g}..{hi[1]:g}, outside slide {slide} ({w}x{h} at level 0); "
                "was it exported at another scale, or for another slide?")


def load_labels(cfg: Any, dims: Mapping[str, tuple[int, int]],
                file_names: Mapping[str, str]) -> Labelling:
    """Read the label source named in a ``WsiConfig`` and check it against the slides.

    Args:
        cfg: The run's ``WsiConfig``.
        dims: Slide id -> level-0 (width, height).
        file_names: Slide file name -> slide id (annotations may name either).
    """
    aliases = {**file_names, **{s: s for s in dims}}  # a stem beats another file's name
    files: list[Path] = []
    points: dict[str, PointSet] = {}
    polygons: dict[str, tuple[Polygon, ...]] = {}
    if cfg.slide_labels_csv is not None:
        path = Path(cfg.slide_labels_csv)
        named = read_slide_labels(path, aliases)
        missing = sorted(set(dims) - set(named))
        if missing:
            raise CapsmedError(f"{path}: no label for slide(s) {', '.join(missing[:5])}")
        names = sorted(set(named.values()))
        index = {c: i for i, c in enumerate(names)}
        per = {s: SlideLabels("slide", index, slide_label=index[named[s]]) for s in dims}
        return Labelling("slide", names, per, {str(path): path.stat().st_size})
    if cfg.points_csv is not None:
        mode, path = "points", Path(cfg.points_csv)
        points, files = read_points_csv(path, aliases), [path]
        for slide, ps in points.items():
            w, h = dims[slide]
            bad = np.flatnonzero((ps.xy < 0).any(axis=1) | (ps.xy[:, 0] >= w)
                                 | (ps.xy[:, 1] >= h))
            if len(bad):
                x, y = ps.xy[bad[0]]
                raise CapsmedError(f"{path}: line {ps.lines[bad[0]]}: point ({x:g}, {y:g}) is "
                                   f"outside slide {slide} ({w}x{h} at level 0)")
        for s in sorted(set(dims) - set(points)):
            log.warning("%s: no point in %s for this slide; all its tiles are unlabelled",
                        s, path)
        classes = {c for ps in points.values() for c in ps.labels}
    else:
        mode = "polygons"
        matched = match_geojson([Path(p) for p in cfg.geojson], aliases)
        polygons = {s: tuple(read_geojson(f)) for s, f in matched.items()}
        files = list(matched.values())
        for slide, shapes in polygons.items():
            _check_polygons_fit(matched[slide], slide, shapes, dims[slide])
        for s in sorted(set(dims) - set(matched)):
            log.warning("%s: no GeoJSON for this slide; all its tiles are unlabelled", s)
        classes = {p.label for ps in polygons.values() for p in ps}
        if not classes and not cfg.allow_no_annotations:
            looked = ", ".join(str(g) for g in cfg.geojson)
            raise CapsmedError(f"{looked}: no classified polygon for any of the "
                               f"{len(dims)} slide(s) ({len(matched)} GeoJSON file(s) "
                               "matched a slide); every tile would be unlabelled (pass "
                               "--allow-no-annotations to write such a set)")
    if cfg.unlabelled == "background":
        classes.add(cfg.background_class)
    if not classes:
        raise CapsmedError(f"{files[0] if files else cfg.geojson[0]}: no classified "
                           "annotations and --unlabelled drop: no tile can be labelled")
    names = sorted(classes)
    index = {c: i for i, c in enumerate(names)}
    per = {s: SlideLabels(mode, index, points=points.get(s), polygons=polygons.get(s, ()),
                          min_overlap=cfg.min_overlap) for s in dims}
    return Labelling(mode, names, per, {str(f): f.stat().st_size for f in files})
