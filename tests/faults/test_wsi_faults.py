"""Whole-slide faults (issue 12): annotations all absent, a slide smaller than a tile,
splits missing a class, and what ``data info`` says about the source."""

from __future__ import annotations

import logging

import cv2
import numpy as np

from capsmed.cli import app
from capsmed.data.contract import read_info
from capsmed.data.sources.wsi.reader import preprocess_wsi
from tests.helpers import assert_clean_failure
from tests.test_wsi import _cfg, _labels_csv, _slide, runner  # skips without OpenSlide


def _geojson_without_polygons(tmp_path):
    folder = tmp_path / "geo"
    folder.mkdir()
    (folder / "a.geojson").write_text('{"type": "FeatureCollection", "features": []}')
    return [str(tmp_path / "slides"), "--geojson", str(folder)], folder, \
        "no classified polygon for any of the 1 slide(s)"


def test_annotations_all_absent_are_refused_unless_allowed(tmp_path):
    """Issue 12 item 4: every tile became 'background' and the run exited 0."""
    (tmp_path / "slides").mkdir()
    _slide(tmp_path / "slides" / "a.svs")
    args, folder, message = _geojson_without_polygons(tmp_path)
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "wsi", *args, "-o", str(out),
                                 "--workers", "1", "--tile-size", "128"])
    assert_clean_failure(result, str(folder), out)
    assert message in result.stderr
    result = runner.invoke(app, ["-q", "preprocess", "wsi", *args, "-o", str(out),
                                 "--workers", "1", "--tile-size", "128",
                                 "--allow-no-annotations"])
    assert result.exit_code == 0, result.output
    assert read_info(out).class_names == ("background",)


def _captured(caplog):
    """caplog, also after the CLI's logging set-up stopped 'capsmed' propagating."""
    logger = logging.getLogger("capsmed")
    logger.addHandler(caplog.handler)
    return logger


def test_a_slide_smaller_than_a_tile_is_called_too_small(tmp_path, caplog):
    """Issue 12 item 24: a 1x1 slide was also reported as having too little tissue."""
    _slide(tmp_path / "a.svs")
    tiny = tmp_path / "tiny.png"
    cv2.imwrite(str(tiny), np.full((1, 1, 3), 200, np.uint8))
    csv = _labels_csv(tmp_path / "l.csv", ["a,x", "tiny,y"])
    logger = _captured(caplog)
    try:
        preprocess_wsi([tmp_path], tmp_path / "s.h5", _cfg(slide_labels_csv=str(csv)))
    finally:
        logger.removeHandler(caplog.handler)
    assert "tiny.png: the slide is 1x1 px at level 0, smaller than one 128 px tile" \
        in caplog.text
    assert "tiny.png: no tiles kept" not in caplog.text


def test_a_split_without_some_class_is_warned_about(tmp_path, caplog):
    """Issue 12 item 26: WSI splits missing a class gave no warning (folder sets did)."""
    for seed, name in enumerate(("p", "q", "r")):  # three slides, not one copied
        _slide(tmp_path / f"{name}.svs", size=768, seed=seed)
    csv = _labels_csv(tmp_path / "l.csv", ["p,x", "q,x", "r,y"])
    train = _labels_csv(tmp_path / "train.txt", ["p", "r"])
    test = _labels_csv(tmp_path / "test.txt", ["q"])
    cfg = _cfg(slide_labels_csv=str(csv), split_files={"train": str(train), "test": str(test)})
    logger = _captured(caplog)
    try:
        preprocess_wsi([tmp_path], tmp_path / "s.h5", cfg)
    finally:
        logger.removeHandler(caplog.handler)
    assert "split(s) missing a class: test (y)" in caplog.text


def test_data_info_names_the_slide_folder_and_files(tmp_path):
    """Issue 12 item 24: `capsmed data info` showed 'source: ?' for WSI files."""
    _slide(tmp_path / "a.svs")
    csv = _labels_csv(tmp_path / "l.csv", ["a,x"])
    out = preprocess_wsi([tmp_path / "a.svs"], tmp_path / "s.h5",
                         _cfg(slide_labels_csv=str(csv)))
    source = read_info(out).source
    assert source["raw_dir"] == str(tmp_path.resolve())
    assert source["files"]["a.svs"] == (tmp_path / "a.svs").stat().st_size
    result = runner.invoke(app, ["data", "info", str(out)])
    assert f"source: {tmp_path.resolve()} (2 files" in " ".join(result.output.split())


def test_a_split_whose_only_slide_was_skipped_is_warned_about(tmp_path, caplog):
    """Issue 23 item 7: the only test slide was too small; the file was written with an
    empty test split and no warning."""
    _slide(tmp_path / "a.svs")
    tiny = tmp_path / "tiny.png"
    cv2.imwrite(str(tiny), np.full((1, 1, 3), 200, np.uint8))
    csv = _labels_csv(tmp_path / "l.csv", ["a,x", "tiny,y"])
    train = _labels_csv(tmp_path / "train.txt", ["a"])
    test = _labels_csv(tmp_path / "test.txt", ["tiny"])
    logger = _captured(caplog)
    try:
        out = preprocess_wsi([tmp_path], tmp_path / "s.h5", _cfg(
            slide_labels_csv=str(csv), split_files={"train": str(train), "test": str(test)}))
    finally:
        logger.removeHandler(caplog.handler)
    assert "test" not in read_info(out).split_sizes
    assert "split 'test' holds no tile: its slide(s)" in caplog.text
    assert "tiny.png" in caplog.text.split("holds no tile")[1]
    assert "split 'train' holds no tile" not in caplog.text
