"""`capsmed predict` outputs: the per-window CSV, QuPath GeoJSON, score maps, heatmaps."""

from __future__ import annotations

import csv
import json
import struct
import time
import uuid

import numpy as np
import pytest

from capsmed.predict.outputs import (
    InputResult,
    geojson,
    positives,
    score_map,
    write_geojson,
    write_heatmap,
    write_predictions_csv,
)

CLASSES = ["normal", "mitosis"]


def two_windows(**kw) -> InputResult:
    """A 100x100 input with two overlapping 40-px windows, at x=30 and x=50."""
    args = {"name": "slides/case 1.svs", "size": (100, 100), "x": np.array([30, 50]),
            "y": np.array([30, 30]), "footprint": 40.0,
            "scores": np.array([[0.8, 0.2], [0.4, 0.6]])}
    return InputResult(**{**args, **kw})


def no_temp_files(folder, *expected: str) -> None:
    assert sorted(p.name for p in folder.iterdir()) == sorted(expected)


def test_predicted_is_argmax():
    result = two_windows()
    assert result.predicted.tolist() == [0, 1]
    assert result.predicted.dtype == np.int64


def test_the_called_class_follows_its_threshold_everywhere(tmp_path):
    """Capsule lengths are independent: both classes of a window can exceed 0.5. The
    threshold on the called class decides, and the CSV's predicted class, the GeoJSON
    detections and the counts agree on every window."""
    scores = np.array([[0.9, 0.6], [0.7, 0.3], [0.2, 0.95], [0.1, 0.4]])
    result = two_windows(x=np.array([20, 40, 60, 80]), y=np.array([30] * 4), scores=scores,
                         class_index=1, threshold=0.5)
    assert result.predicted.tolist() == [1, 0, 1, 0]  # window 0: 0.6 >= 0.5, not argmax
    assert positives(result, 1, 0.5).tolist() == [True, False, True, False]
    write_predictions_csv(tmp_path / "p.csv", [result], CLASSES)
    with open(tmp_path / "p.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    called = [r["predicted"] == "mitosis" for r in rows]
    features = geojson(result, CLASSES, 1, 0.5, "tile")["features"]
    assert called == [float(r["score_mitosis"]) >= 0.5 for r in rows]
    assert len(features) == sum(called) == 2
    raised = two_windows(x=np.array([20, 40, 60, 80]), y=np.array([30] * 4), scores=scores,
                         class_index=1, threshold=0.7)
    assert raised.predicted.tolist() == [0, 0, 1, 0]
    # an image-level prediction (one per image) is the highest-scoring class
    assert two_windows(scores=scores[:2], windowed=False, class_index=1).predicted.tolist() \
        == [0, 0]


def test_csv_header_rows_and_quoting(tmp_path):
    names = ['tumour, grade "2"', "a b", "a_b"]  # a comma, quotes, names alike once sanitised
    scores = np.array([[0.123456789, 0.5, 0.376543211], [1e-9, 0.25, 0.75]])
    first = InputResult("x/one.png", (64, 64), np.array([10, 20]), np.array([11, 21]),
                        31.6, scores)
    second = InputResult("two,three.png", (8, 8), np.array([4]), np.array([4]), 8.0,
                         np.array([[0.9, 0.05, 0.05]]), windowed=False)
    path = tmp_path / "predictions.csv"
    write_predictions_csv(path, [first, second], names)

    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    header = rows[0]
    assert header[:4] == ["input", "centre_x", "centre_y", "size"] and header[-1] == "predicted"
    columns = header[4:-1]
    assert len(set(columns)) == 3 and columns[0] == 'score_tumour,_grade_"2"'
    assert columns[1] == "score_a_b" and columns[2].startswith("score_a_b")
    assert rows[1] == ["x/one.png", "10", "11", "32", "0.123457", "0.5", "0.376543", "a b"]
    assert rows[2] == ["x/one.png", "20", "21", "32", "1e-09", "0.25", "0.75", "a_b"]
    assert rows[3] == ["two,three.png", "4", "4", "8", "0.9", "0.05", "0.05", names[0]]
    assert len(rows) == 4
    assert '"tumour, grade ""2"""' in path.read_text()  # quoted by the csv module
    no_temp_files(tmp_path, "predictions.csv")


def test_csv_rejects_scores_that_do_not_match_the_classes(tmp_path):
    with pytest.raises(ValueError, match="class names"):
        write_predictions_csv(tmp_path / "p.csv", [two_windows()], ["only one"])
    no_temp_files(tmp_path)


def test_positives():
    assert positives(two_windows(), 1, 0.6).tolist() == [False, True]
    assert positives(two_windows(), 0, 0.4).tolist() == [True, True]


def test_geojson_tile_is_the_window_footprint():
    collection = geojson(two_windows(), CLASSES, 1, 0.5)
    assert collection["type"] == "FeatureCollection"
    (feature,) = collection["features"]
    assert feature["type"] == "Feature"
    assert feature["geometry"] == {"type": "Polygon", "coordinates": [
        [[30.0, 10.0], [70.0, 10.0], [70.0, 50.0], [30.0, 50.0], [30.0, 10.0]]]}
    props = feature["properties"]
    assert props["objectType"] == "detection"
    assert props["classification"] == {"name": "mitosis", "color": [255, 127, 14]}
    assert props["measurements"]["score"] == pytest.approx(0.6)
    assert props["measurements"]["score: normal"] == pytest.approx(0.4)
    assert str(uuid.UUID(feature["id"])) == feature["id"]
    # deterministic, and distinct per window
    assert geojson(two_windows(), CLASSES, 1, 0.5)["features"][0]["id"] == feature["id"]
    ids = {f["id"] for f in geojson(two_windows(), CLASSES, 0, 0.0)["features"]}
    assert len(ids) == 2


def test_geojson_tile_allows_fractional_corners():
    result = two_windows(footprint=5.0)
    ring = geojson(result, CLASSES, 1, 0.5)["features"][0]["geometry"]["coordinates"][0]
    assert ring[0] == [47.5, 27.5] and ring[2] == [52.5, 32.5] and ring[0] == ring[-1]


def test_geojson_point_is_an_annotation_at_the_centre():
    (feature,) = geojson(two_windows(), CLASSES, 0, 0.7, shape="point")["features"]
    assert feature["geometry"] == {"type": "Point", "coordinates": [30, 30]}
    assert feature["properties"]["objectType"] == "annotation"
    assert feature["properties"]["classification"]["name"] == "normal"
    tile_id = geojson(two_windows(), CLASSES, 0, 0.7)["features"][0]["id"]
    assert feature["id"] != tile_id  # both may be imported into one image


def test_geojson_colours_are_matplotlib_tab10():
    from capsmed.figures import pyplot

    tab10 = [[round(c * 255) for c in rgb] for rgb in pyplot().cm.tab10.colors]
    names = [f"c{i}" for i in range(12)]
    result = two_windows(scores=np.ones((2, 12)))
    for k in (0, 3, 9, 11):
        colour = geojson(result, names, k, 0.5)["features"][0]["properties"]["classification"]
        assert colour["color"] == tab10[k % 10]


def test_geojson_without_positives_is_an_empty_collection(tmp_path):
    collection = geojson(two_windows(), CLASSES, 1, 0.99)
    assert collection == {"type": "FeatureCollection", "features": []}
    write_geojson(tmp_path / "empty.geojson", collection)
    assert json.loads((tmp_path / "empty.geojson").read_text()) == collection


def test_geojson_rejects_unknown_shapes_and_unwindowed_inputs():
    with pytest.raises(ValueError, match="shape"):
        geojson(two_windows(), CLASSES, 1, 0.5, shape="circle")
    with pytest.raises(ValueError, match="whole image"):
        geojson(two_windows(windowed=False), CLASSES, 1, 0.5)


def test_write_geojson_round_trips_compact_json(tmp_path):
    collection = geojson(two_windows(), CLASSES, 0, 0.0)
    path = tmp_path / "cells.geojson"
    write_geojson(path, collection)
    text = path.read_text()
    assert json.loads(text) == collection and ": " not in text.replace("score: ", "")
    no_temp_files(tmp_path, "cells.geojson")


def test_score_map_means_overlaps_and_leaves_uncovered_pixels_nan():
    # 100 px -> 10 px: windows cover columns 1..4 (x 10-50) and 3..6 (x 30-70), rows 1..4
    values = score_map(two_windows(), 1, (10, 10))
    assert values.dtype == np.float32 and values.shape == (10, 10)
    assert values[2, 1] == pytest.approx(0.2)  # first window only
    assert values[2, 3] == pytest.approx(0.4)  # both: mean of 0.2 and 0.6
    assert values[4, 4] == pytest.approx(0.4)
    assert values[2, 6] == pytest.approx(0.6)  # second window only
    assert np.isnan(values[0, 0]) and np.isnan(values[2, 7]) and np.isnan(values[5, 3])
    assert np.isfinite(values).sum() == 4 * 6


def test_score_map_gives_a_tiny_window_one_pixel():
    result = two_windows(x=np.array([55]), y=np.array([99]), footprint=1.0,
                         scores=np.array([[0.3, 0.7]]))
    values = score_map(result, 1, (10, 10))
    assert np.isfinite(values).sum() == 1 and values[9, 5] == pytest.approx(0.7)


def test_score_map_is_fast_for_many_windows():
    rng = np.random.default_rng(0)
    n = 100_000
    result = InputResult("big.svs", (50_000, 50_000), rng.integers(0, 50_000, n),
                         rng.integers(0, 50_000, n), 256.0, rng.random((n, 2)))
    start = time.perf_counter()
    values = score_map(result, 1, (1000, 1000))
    assert time.perf_counter() - start < 1.0
    covered = values[np.isfinite(values)]
    assert covered.size > 0 and covered.min() >= 0 and covered.max() <= 1


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("thumbnail", [True, False])
def test_heatmap_is_a_readable_png(tmp_path, thumbnail):
    rng = np.random.default_rng(1)
    thumb = rng.integers(0, 255, (50, 100, 3), dtype=np.uint8) if thumbnail else None
    grid = np.arange(20, 200, 40)
    x, y = (a.ravel() for a in np.meshgrid(grid, grid[:2]))
    result = InputResult("in/slide.tif", (200, 100), x, y, 40.0, rng.random((x.size, 2)),
                         thumbnail=thumb)
    path = tmp_path / "slide.heatmap.png"
    write_heatmap(path, result, CLASSES, 1, threshold=0.5)
    width, height = png_size(path)
    assert 500 <= width <= 1400 and 200 <= height <= 1000 and width > height
    no_temp_files(tmp_path, "slide.heatmap.png")


def test_heatmap_accepts_scores_outside_unit_range(tmp_path):
    result = two_windows(scores=np.array([[-3.0, 2.0], [1.0, 5.0]]))
    path = tmp_path / "logits.png"
    write_heatmap(path, result, CLASSES, 1)
    assert png_size(path)[0] > 0


def test_a_suffixed_score_column_is_never_another_classs_name(tmp_path):
    """``a b`` and ``a_b`` both sanitise to ``score_a_b``; the second must not take
    ``score_a_b_2``, the column the class ``a_b_2`` is named by (it would hold a_b's
    scores under a_b_2's name, and a_b_2's under a suffix)."""
    names = ["a b", "a_b", "a_b_2"]
    scores = np.array([[0.1, 0.2, 0.7]])
    result = InputResult("x.png", (8, 8), np.array([4]), np.array([4]), 8.0, scores,
                         windowed=False)
    path = tmp_path / "predictions.csv"
    write_predictions_csv(path, [result], names)
    with path.open(newline="") as fh:
        header, row = list(csv.reader(fh))
    column = dict(zip(header, row, strict=True))
    assert len(set(header)) == len(header)
    assert column["score_a_b_2"] == "0.7"  # the class a_b_2's own score
    assert column["score_a_b"] == "0.1" and column["predicted"] == "a_b_2"
