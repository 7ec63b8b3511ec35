"""What `capsmed predict` writes: a per-window CSV, QuPath GeoJSON and heatmap PNGs.

Everything here works on :class:`InputResult`, the windows' centres and scores for one
input, and knows nothing about models or slide readers. Coordinates are level-0 pixels
throughout, the frame QuPath and slide viewers use.
"""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capsmed.figures import plain, pyplot, save_figure
from capsmed.io import write_text_atomic

# matplotlib's tab10 as 0-255 RGB, so a class keeps its colour across files and runs
# without importing matplotlib to write a GeoJSON.
CLASS_COLOURS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40),
                 (148, 103, 189), (140, 86, 75), (227, 119, 194), (127, 127, 127),
                 (188, 189, 34), (23, 190, 207))
SHAPES = ("tile", "point")
HEATMAP_MAX_SIDE = 1024  # map resolution when the input has no thumbnail
_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "capsmed/predict")


@dataclass
class InputResult:
    """The predictions for one input (an image or a slide)."""

    name: str  # the input as shown in outputs (a path string)
    size: tuple[int, int]  # (width, height) of the input in level-0 pixels
    x: np.ndarray  # int64 [N] window centres, level-0 px (column)
    y: np.ndarray  # int64 [N] window centres, level-0 px (row)
    footprint: float  # side of each (square) window in level-0 px
    scores: np.ndarray  # float [N, K]: per-class probability (softmax) or capsule length
    thumbnail: np.ndarray | None = None  # RGB uint8 (h, w, 3), any downscale of the input
    windowed: bool = True  # False: one prediction for the whole image (no heatmap/GeoJSON)
    class_index: int | None = None  # the --class a windowed run calls at ``threshold``
    threshold: float = 0.5

    @property
    def predicted(self) -> np.ndarray:
        """The class of each window, int64 [N], by one rule that the CSV, the GeoJSON,
        the heatmap and the counts share: a window of a windowed run is its
        ``class_index`` exactly when that class's score reaches ``threshold``
        (:func:`positives`), else the highest-scoring other class. Capsule lengths are
        independent, so two classes can both exceed 0.5: the threshold decides, not the
        longer capsule. An image-level prediction is the highest-scoring class."""
        scores = np.asarray(self.scores, dtype=np.float64)
        best = np.argmax(scores, axis=1).astype(np.int64) if scores.size else \
            np.zeros(len(scores), np.int64)
        c = self.class_index
        if not self.windowed or c is None or scores.shape[1] < 2:
            return best
        others = scores.copy()
        others[:, c] = -np.inf
        return np.where(scores[:, c] >= self.threshold, c,
                        np.argmax(others, axis=1)).astype(np.int64)


def _score_columns(class_names: Sequence[str]) -> list[str]:
    """``score_<class>`` per class (spaces as ``_``), made unique with ``_2``, ``_3``...

    Two names that sanitise alike (``"a b"`` and ``"a_b"``) still get distinct columns,
    and every column stays readable as the class it holds: a suffix never gives one
    class the column another class is named by (``"a b"``, ``"a_b"``, ``"a_b_2"``:
    ``score_a_b_2`` is the class ``a_b_2``'s, ``a_b``'s is ``score_a_b_3``).
    """
    bases = ["score_" + str(name).replace(" ", "_") for name in class_names]
    columns: list[str] = []
    for base in bases:
        column, n = base, 1
        while column in columns or (column != base and column in bases):
            n += 1
            column = f"{base}_{n}"
        columns.append(column)
    return columns


def write_predictions_csv(path: Path, results: Sequence[InputResult],
                          class_names: Sequence[str]) -> None:
    """Write one row per window of every input to ``path`` atomically.

    Columns: ``input, centre_x, centre_y, size, score_<class>..., predicted``: the
    window's centre in the input's level-0 pixels (a slide-set dataset records its
    tiles' top-left corners as ``left``, ``top``: ``centre = left + size / 2``, a half
    rounded down); ``size`` is the footprint rounded to whole pixels, scores have 6
    significant digits and
    ``predicted`` is the class name. The csv module quotes names with commas or quotes.
    """
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["input", "centre_x", "centre_y", "size", *_score_columns(class_names),
                     "predicted"])
    names = np.asarray([str(c) for c in class_names], dtype=object)
    for result in results:
        scores = np.asarray(result.scores, dtype=np.float64)
        if scores.ndim != 2 or scores.shape[1] != len(class_names):
            raise ValueError(f"{result.name}: scores of shape {scores.shape} do not match "
                             f"{len(class_names)} class names")
        text = np.char.mod("%.6g", scores).tolist()
        size = str(round(result.footprint))
        labels = names[result.predicted].tolist()
        writer.writerows([result.name, str(int(x)), str(int(y)), size, *row, label]
                         for x, y, row, label in zip(result.x, result.y, text, labels,
                                                     strict=True))
    write_text_atomic(path, buffer.getvalue())


def positives(result: InputResult, class_index: int, threshold: float) -> np.ndarray:
    """bool [N]: the windows whose score for ``class_index`` is at least ``threshold``."""
    return np.asarray(result.scores)[:, class_index] >= threshold


def _require_windows(result: InputResult, what: str) -> None:
    if not result.windowed:
        raise ValueError(f"{result.name}: one prediction for the whole image has no {what}")


def geojson(result: InputResult, class_names: Sequence[str], class_index: int,
            threshold: float, shape: str = "tile") -> dict:
    """The windows of ``result`` positive for a class as a GeoJSON FeatureCollection.

    The layout is the one QuPath (0.4 and later) reads and writes: each feature has a
    UUID ``id`` and ``properties`` with ``objectType``, ``classification`` (name and RGB
    colour) and ``measurements`` (a name -> number map). Import it in QuPath with
    File > Import objects, or drag and drop it onto the image.

    Args:
        result: the input's windows and scores.
        class_names: the model's class names, in score order.
        class_index: the class whose positive windows become features.
        threshold: a window is positive when its score is ``>= threshold``.
        shape: ``"tile"``: each window's square footprint as a Polygon detection (a
            heatmap of tiles in QuPath); ``"point"``: its centre as a Point annotation
            (one clickable marker per window, handy for sparse findings such as mitoses).

    Returns:
        The FeatureCollection as a dict; no positives give an empty ``features`` list.

    Raises:
        ValueError: for an unknown ``shape`` or an input without windows.
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    _require_windows(result, "GeoJSON")
    class_name = str(class_names[class_index])
    classification = {"name": class_name,
                      "color": list(CLASS_COLOURS[class_index % len(CLASS_COLOURS)])}
    scores = np.asarray(result.scores, dtype=np.float64)
    half = result.footprint / 2
    features = []
    for i in np.flatnonzero(positives(result, class_index, threshold)):
        x, y = int(result.x[i]), int(result.y[i])
        if shape == "tile":
            x0, y0, x1, y1 = x - half, y - half, x + half, y + half
            ring = [[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]
            geometry = {"type": "Polygon", "coordinates": [ring]}
        else:
            geometry = {"type": "Point", "coordinates": [x, y]}
        # JSON has no NaN; a non-finite score of another class is left out.
        measurements = {"score": float(scores[i, class_index])}
        measurements.update({f"score: {c}": float(s) for c, s in zip(class_names, scores[i],
                                                                     strict=True)
                             if np.isfinite(s)})
        # Deterministic ids: the same window, class and shape always get the same UUID.
        key = f"{result.name}|{x}|{y}|{class_name}|{shape}"
        properties = {"objectType": "detection" if shape == "tile" else "annotation",
                      "classification": dict(classification), "measurements": measurements}
        features.append({"type": "Feature", "id": str(uuid.uuid5(_ID_NAMESPACE, key)),
                         "geometry": geometry, "properties": properties})
    return {"type": "FeatureCollection", "features": features}


def write_geojson(path: Path, collection: dict) -> None:
    """Write a GeoJSON ``collection`` to ``path`` atomically, as compact strict JSON."""
    write_text_atomic(path, json.dumps(collection, separators=(",", ":"), allow_nan=False)
                      + "\n")


def score_map(result: InputResult, class_index: int, shape: tuple[int, int]) -> np.ndarray:
    """float32 ``shape`` = ``(h, w)``: the class's score per pixel of a downscaled input.

    Each window is mapped to the map's scale (rounded to whole pixels, at least one
    pixel each) and a pixel gets the mean score of the windows covering it, NaN where
    none does. The windows are summed into a 2-D difference array (``+v`` at the top-left
    corner, ``-v`` right and below, ``+v`` diagonally) whose cumulative sums along both
    axes give the per-pixel totals: O(N + h*w), fast for 100k windows.
    """
    _require_windows(result, "score map")
    h, w = int(shape[0]), int(shape[1])
    (width, height), half = result.size, result.footprint / 2
    sx, sy = w / width, h / height
    x, y = np.asarray(result.x, dtype=np.float64), np.asarray(result.y, dtype=np.float64)
    v = np.asarray(result.scores, dtype=np.float64)[:, class_index]
    keep = (np.isfinite(v) & (x + half > 0) & (x - half < width)
            & (y + half > 0) & (y - half < height))
    x, y, v = x[keep], y[keep], v[keep]

    def pixels(lo: np.ndarray, hi: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        # floor(v + 0.5): round half up, so edge-to-edge windows share no pixel
        start = np.clip(np.floor(lo + 0.5), 0, n - 1).astype(np.int64)
        stop = np.clip(np.floor(hi + 0.5), start + 1, n).astype(np.int64)
        return start, stop

    c0, c1 = pixels((x - half) * sx, (x + half) * sx, w)
    r0, r1 = pixels((y - half) * sy, (y + half) * sy, h)
    index = np.concatenate([r0 * (w + 1) + c0, r0 * (w + 1) + c1,
                            r1 * (w + 1) + c0, r1 * (w + 1) + c1])
    sign = np.repeat([1.0, -1.0, -1.0, 1.0], len(v))
    size = (h + 1) * (w + 1)

    def accumulate(weights: np.ndarray) -> np.ndarray:
        diff = np.bincount(index, weights=weights, minlength=size).reshape(h + 1, w + 1)
        return diff.cumsum(axis=0).cumsum(axis=1)[:h, :w]

    total = accumulate(sign * np.tile(v, 4))
    count = np.rint(accumulate(sign))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / count, np.nan)
    return mean.astype(np.float32)


def _map_shape(result: InputResult) -> tuple[int, int]:
    if result.thumbnail is not None:
        return tuple(result.thumbnail.shape[:2])
    width, height = result.size
    scale = min(1.0, HEATMAP_MAX_SIDE / max(width, height))
    return max(1, round(height * scale)), max(1, round(width * scale))


def write_heatmap(path: Path, result: InputResult, class_names: Sequence[str],
                  class_index: int, threshold: float | None = None) -> None:
    """Draw the class's score map over the input's thumbnail and save it as a PNG.

    The map is semi-transparent (uncovered pixels fully so) over the thumbnail, or over
    a grey canvas of the input's aspect when there is none; axes are level-0 pixels.
    Scores within [0, 1] use that colour range, others their own range.

    Args:
        path: the PNG to write (atomically).
        result: the input's windows, scores and optional thumbnail.
        class_names: the model's class names, in score order.
        class_index: the class to show.
        threshold: when given, the title counts the windows scoring at least this.
    """
    _require_windows(result, "heatmap")
    plt = pyplot()
    shape = _map_shape(result)
    values = score_map(result, class_index, shape)
    scores = np.asarray(result.scores, dtype=np.float64)[:, class_index]
    finite = scores[np.isfinite(scores)]
    vmin, vmax = 0.0, 1.0
    if finite.size and (finite.min() < 0 or finite.max() > 1):
        vmin, vmax = float(finite.min()), float(finite.max())
        if vmax <= vmin:
            vmin, vmax = vmin - 0.5, vmax + 0.5
    background = (result.thumbnail if result.thumbnail is not None
                  else np.full((*shape, 3), 200, dtype=np.uint8))

    width, height = result.size
    extent = (0, width, height, 0)  # axes in level-0 px, whatever the map's scale
    # 8 inches wide; about 1.7 of them go to the colour bar and labels
    fig_h = float(np.clip(6.3 * height / width + 1.2, 2.5, 11.0))
    fig, ax = plt.subplots(figsize=(8.0, fig_h), layout="constrained")
    ax.imshow(background, extent=extent, interpolation="antialiased")
    cmap = plt.get_cmap("inferno").with_extremes(bad=(0.0, 0.0, 0.0, 0.0))
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=vmin, vmax=vmax,
                      alpha=0.55, extent=extent, interpolation="nearest")
    # the bar shows the colours themselves, not their see-through overlay
    opaque = plt.cm.ScalarMappable(norm=image.norm, cmap=cmap)
    class_name = plain(class_names[class_index])
    fig.colorbar(opaque, ax=ax, shrink=0.9, label=f"score: {class_name}")
    title = f"{plain(Path(result.name).name)}: {class_name}"
    if threshold is not None:
        n = int(positives(result, class_index, threshold).sum())
        title += f", {n} of {len(scores)} windows \u2265 {threshold:g}"
    ax.set(title=title, xlabel="x (level-0 px)", ylabel="y (level-0 px)")
    save_figure(fig, path)
