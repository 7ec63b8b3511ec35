"""Whole-slide annotations: point CSVs, slide-label CSVs and QuPath GeoJSON polygons.

Coordinates are level-0 pixels with the origin at the top-left corner, as QuPath and
every WSI viewer export them. This module parses and validates the files (errors name
the file and line); :mod:`capsmed.data.sources.wsi.tile_labels` turns the annotations into
tile labels.
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


def _legacy_kind(feature: dict) -> str:
    """Object type of a feature without ``objectType``: QuPath before 0.3 wrote it as the
    feature's ``id`` (``PathAnnotationObject``, ``PathDetectionObject``, ``PathCellObject``
    ...), so its cells and detections are not read as annotations; else ``annotation``."""
    ident = feature.get("id")
    if isinstance(ident, str) and ident.startswith("Path") and ident.endswith("Object"):
        return ident
    return "annotation"


def read_geojson(path: Path) -> list[Polygon]:
    """Read the classified polygon annotations of a QuPath-style GeoJSON export.

    Accepts a ``FeatureCollection``, a single ``Feature`` or a plain JSON array of
    features (QuPath's export without ``FEATURE_COLLECTION``). Only features whose
    ``properties.objectType`` is ``annotation`` (or absent; QuPath 0.2's feature ``id``
    ``PathDetectionObject``, ``PathCellObject`` ... marks others) with an area geometry
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
        kind = props.get("objectType", props.get("object_type", _legacy_kind(feature)))
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
