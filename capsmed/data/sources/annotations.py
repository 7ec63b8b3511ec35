"""Whole-slide annotations: point CSVs, slide-label CSVs and QuPath GeoJSON polygons.

Coordinates are level-0 pixels with the origin at the top-left corner, as QuPath and
every WSI viewer export them. This module parses and validates the files (errors name
the file and line) and turns annotations into tile labels:

* points: a tile takes the class of a point inside its footprint (the point nearest
  the tile centre when several are);
* polygons: a tile takes the class of the polygon covering its centre, or with a
  minimum overlap, the class covering the largest share of the tile. Where polygons
  overlap the smallest one wins, so a "Necrosis" region drawn inside a "Tumor" region
  labels the tiles inside it, as QuPath's annotation hierarchy intends.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)

GEOJSON_SUFFIXES = (".geojson", ".json")


@dataclass(frozen=True)
class PointSet:
    """Point annotations of one slide: level-0 ``xy`` (K, 2), class names, CSV lines."""

    xy: np.ndarray
    labels: tuple[str, ...]
    lines: tuple[int, ...]
    source: str


@dataclass(frozen=True)
class Polygon:
    """One polygon annotation: class, exterior ring (N, 2) x,y, holes, and its area."""

    label: str
    exterior: np.ndarray
    holes: tuple[np.ndarray, ...]
    area: float


def _read_rows(path: Path) -> list[tuple[int, list[str]]]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            return [(reader.line_num, [c.strip() for c in row]) for row in reader
                    if any(c.strip() for c in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CapsmedError(f"{path}: cannot read CSV ({exc})") from exc


def _slide_of(name: str, aliases: Mapping[str, str], path: Path, line: int) -> str:
    if name in aliases:
        return aliases[name]
    known = ", ".join(sorted(set(aliases.values()))[:5])
    raise CapsmedError(f"{path}: line {line}: slide '{name}' is not among the input slides "
                       f"({known}{', ...' if len(set(aliases.values())) > 5 else ''})")


def read_points_csv(path: Path, aliases: Mapping[str, str]) -> dict[str, PointSet]:
    """Read ``slide,x,y,label`` point annotations (level-0 px), header optional.

    Args:
        path: The CSV. With a header, columns are found by name (``slide``, ``x``, ``y``,
            ``label``; others ignored); without one they are taken in that order.
        aliases: Slide name or file name -> slide id.

    Returns:
        ``{slide_id: PointSet}`` for every slide named in the file.
    """
    path = Path(path)
    rows = _read_rows(path)
    cols = {"slide": 0, "x": 1, "y": 2, "label": 3}
    if rows and {"slide", "x", "y", "label"} <= {c.lower() for c in rows[0][1]}:
        header = [c.lower() for c in rows[0][1]]
        cols = {k: header.index(k) for k in cols}
        rows = rows[1:]
    found: dict[str, tuple[list, list, list]] = {}
    for line, row in rows:
        try:
            name, label = row[cols["slide"]], row[cols["label"]]
            x, y = float(row[cols["x"]]), float(row[cols["y"]])
            if not (label and np.isfinite(x) and np.isfinite(y)):
                raise ValueError
        except (IndexError, ValueError):
            raise CapsmedError(f"{path}: line {line}: expected 'slide,x,y,label' with numeric "
                               f"x, y and a label, got {','.join(row)!r}") from None
        xy, labels, lines = found.setdefault(_slide_of(name, aliases, path, line), ([], [], []))
        xy.append((x, y))
        labels.append(label)
        lines.append(line)
    if not found:
        raise CapsmedError(f"{path}: no point annotations (expected rows 'slide,x,y,label')")
    return {s: PointSet(np.array(xy, dtype=np.float64).reshape(-1, 2), tuple(lab), tuple(ln),
                        str(path)) for s, (xy, lab, ln) in found.items()}


def read_slide_labels(path: Path, aliases: Mapping[str, str]) -> dict[str, str]:
    """Read ``slide,label`` rows (header optional) -> ``{slide_id: label}``."""
    path = Path(path)
    rows = _read_rows(path)
    if rows and [c.lower() for c in rows[0][1][:2]] == ["slide", "label"]:
        rows = rows[1:]
    out: dict[str, str] = {}
    for line, row in rows:
        if len(row) < 2 or not row[0] or not row[1]:
            raise CapsmedError(f"{path}: line {line}: expected 'slide,label', got "
                               f"{','.join(row)!r}")
        slide = _slide_of(row[0], aliases, path, line)
        if out.get(slide, row[1]) != row[1]:
            raise CapsmedError(f"{path}: line {line}: slide '{row[0]}' already has label "
                               f"'{out[slide]}'")
        out[slide] = row[1]
    if not out:
        raise CapsmedError(f"{path}: no slide labels (expected rows 'slide,label')")
    return out


def _class_name(value: Any) -> str | None:
    """QuPath classification -> class name (``Tumor``; derived classes ``Tumor: Positive``).

    Accepts every form QuPath writes or reads: ``{"name", "color"}`` (v0.4+),
    ``{"names": [...]}`` for derived classes, a plain string, and the pre-0.4
    ``{"name", "colorRGB", "parentClass"}``.
    """
    if isinstance(value, str):
        return value.strip() or None
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("names"), list) and value["names"]:
        return ": ".join(str(n) for n in value["names"])
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    parent = _class_name(value.get("parentClass"))
    return f"{parent}: {name}" if parent else name


def _ring(coords: Any, path: Path, where: str) -> np.ndarray:
    try:
        ring = np.asarray(coords, dtype=np.float64)
    except (TypeError, ValueError):
        ring = np.empty(0)
    if ring.ndim != 2 or ring.shape[0] < 3 or ring.shape[1] < 2 \
            or not np.isfinite(ring[:, :2]).all():
        raise CapsmedError(f"{path}: {where}: a polygon ring needs at least 3 [x, y] points")
    return ring[:, :2]


def _shoelace(ring: np.ndarray) -> float:
    x, y = ring[:, 0], ring[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def _polygons(geometry: Any, path: Path, where: str) -> list[tuple[np.ndarray, list]]:
    """(exterior, holes) rings of a geometry; point and line geometries have none."""
    if not isinstance(geometry, dict):
        raise CapsmedError(f"{path}: {where}: missing or invalid 'geometry'")
    kind, coords = geometry.get("type"), geometry.get("coordinates")
    if kind == "GeometryCollection":
        return [p for g in geometry.get("geometries") or [] for p in _polygons(g, path, where)]
    if kind not in ("Polygon", "MultiPolygon"):
        return []
    polys = [coords] if kind == "Polygon" else coords
    if not isinstance(polys, list) or not all(isinstance(p, list) and p for p in polys):
        raise CapsmedError(f"{path}: {where}: {kind} coordinates must be lists of rings")
    return [(_ring(p[0], path, where), [_ring(h, path, where) for h in p[1:]]) for p in polys]


def read_geojson(path: Path) -> list[Polygon]:
    """Read the classified polygon annotations of a QuPath-style GeoJSON export.

    Accepts a ``FeatureCollection``, a single ``Feature`` or a plain JSON array of
    features (QuPath's export without ``FEATURE_COLLECTION``). Only features whose
    ``properties.objectType`` is ``annotation`` (or absent) with an area geometry
    (Polygon, MultiPolygon, GeometryCollection) and a classification are used;
    detections, cells, points, lines and unclassified annotations are skipped (logged).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CapsmedError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
                           f"{exc.msg})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CapsmedError(f"{path}: cannot read GeoJSON ({exc})") from exc
    if isinstance(data, dict) and data.get("type") == "FeatureCollection":
        features = data.get("features")
    elif isinstance(data, dict) and data.get("type") == "Feature":
        features = [data]
    else:
        features = data
    if not isinstance(features, list):
        raise CapsmedError(f"{path}: expected a GeoJSON FeatureCollection, a Feature or a "
                           "list of features")
    out: list[Polygon] = []
    skipped = {"not an annotation": 0, "unclassified": 0, "no area": 0}
    for i, feature in enumerate(features):
        if not isinstance(feature, dict):
            raise CapsmedError(f"{path}: feature {i}: expected a JSON object")
        props = feature.get("properties") or {}
        kind = props.get("objectType", props.get("object_type", "annotation"))
        if kind not in ("annotation", "PathAnnotationObject"):
            skipped["not an annotation"] += 1
            continue
        label = _class_name(props.get("classification"))
        rings = _polygons(feature.get("geometry"), path, f"feature {i}")
        if label is None or not rings:
            skipped["unclassified" if label is None else "no area"] += 1
            continue
        for exterior, holes in rings:
            area = _shoelace(exterior) - sum(_shoelace(h) for h in holes)
            out.append(Polygon(label, exterior, tuple(holes), area))
    if any(skipped.values()):
        log.info("%s: skipped %s", path, ", ".join(f"{n} {k}" for k, n in skipped.items() if n))
    return out


def match_geojson(paths: list[Path], aliases: Mapping[str, str]) -> dict[str, Path]:
    """Map each slide id to its GeoJSON file.

    ``paths`` holds files and/or folders. A file's name without ``.geojson``/``.json``
    must be a slide's stem or file name (QuPath scripts often write
    ``slide.svs.geojson``); a named file that matches no slide is an error, while
    unmatched files found in a folder are only logged.
    """
    out: dict[str, Path] = {}
    for given in paths:
        given = Path(given)
        if given.is_dir():
            files = sorted(p for p in given.iterdir() if p.suffix.lower() in GEOJSON_SUFFIXES)
            if not files:
                raise CapsmedError(f"{given}: no .geojson or .json files in this folder")
        elif given.is_file():
            files = [given]
        else:
            raise CapsmedError(f"{given}: no such GeoJSON file or folder")
        for file in files:
            slide = aliases.get(file.name[: -len(file.suffix)])
            if slide is None:
                if given.is_dir():
                    log.warning("%s: names no input slide; ignored", file)
                    continue
                raise CapsmedError(f"{file}: its name matches none of the input slides "
                                   f"(name it <slide>.geojson)")
            if slide in out:
                raise CapsmedError(f"{file}: slide '{slide}' already has annotations in "
                                   f"{out[slide]}")
            out[slide] = file
    return out


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
        classes = {c for ps in points.values() for c in ps.labels}
    else:
        mode = "polygons"
        matched = match_geojson([Path(p) for p in cfg.geojson], aliases)
        polygons = {s: tuple(read_geojson(f)) for s, f in matched.items()}
        files = list(matched.values())
        for s in sorted(set(dims) - set(matched)):
            log.warning("%s: no GeoJSON for this slide; all its tiles are unlabelled", s)
        classes = {p.label for ps in polygons.values() for p in ps}
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
