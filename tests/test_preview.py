"""``capsmed data preview``: a labelled grid of random samples per class."""

from __future__ import annotations

import re

import matplotlib
import numpy as np
import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import DatasetWriter
from capsmed.data.preview import GridLayout, preview_dataset

runner = CliRunner()
PALETTE = np.array([[230, 30, 30], [30, 200, 40], [20, 40, 220]], np.uint8)


def _contract(path, channels, per_class, splits=("train",), folds=None,
              names=("red", "green", "blue"), groups="{split}-{c}-{i}"):
    """A file whose class c images are one flat colour (or grey level 60 + 70c)."""
    with DatasetWriter(path, dataset="flat", kind="folder", domain="generic",
                       class_names=list(names), image_shape=(channels, 6, 6),
                       preprocessing={}, source={}) as writer:
        for split in splits:
            for c, n in enumerate(per_class):
                images = np.zeros((n, channels, 6, 6), np.uint8)
                if channels == 3:
                    images[:] = PALETTE[c][None, :, None, None]
                else:
                    images[:, 0] = 60 + 70 * c
                    images[:, 1:] = 255 - images[:, :1]  # extra channels are not shown
                writer.append(split, images, np.full(n, c),
                              [groups.format(split=split, c=c, i=i % 2) for i in range(n)],
                              folds=None if folds is None else np.arange(n) % folds)
    return path


def _centre(png, layout, row, col):
    left, top, right, bottom = layout.image_box(row, col)
    return png[(top + bottom) // 2, (left + right) // 2, :3]


def test_rgb_grid_size_and_cells(tmp_path):
    data = _contract(tmp_path / "rgb.h5", 3, [5, 2, 0])
    out = preview_dataset(data, tmp_path / "grid.png", per_class=4)
    png = np.rint(imread(out) * 255).astype(int)
    layout = GridLayout(rows=3, per_class=4)
    assert layout.size == (600, 432)  # 150 + 4 * 110 + 10, 50 + 3 * 124 + 10
    assert png.shape[:2] == (432, 600)
    for col in range(4):
        assert _centre(png, layout, 0, col).tolist() == PALETTE[0].tolist()
        expected = PALETTE[1].tolist() if col < 2 else [255, 255, 255]  # 2 greens, then blank
        assert _centre(png, layout, 1, col).tolist() == expected
        if col:  # no blue in train: the row says "no samples" (over cell 0) and stays white
            assert _centre(png, layout, 2, col).tolist() == [255, 255, 255]
    assert (png[:, :, :3] < 128).any()  # labels and title are drawn in dark text


def test_grey_and_multichannel_show_the_first_channel(tmp_path):
    for channels in (1, 5):
        data = _contract(tmp_path / f"c{channels}.h5", channels, [3, 3, 3])
        out = preview_dataset(data, tmp_path / f"c{channels}.png", per_class=2, seed=3)
        png = np.rint(imread(out) * 255).astype(int)
        layout = GridLayout(rows=3, per_class=2)
        assert png.shape[:2] == layout.size[::-1]
        for row in range(3):
            assert _centre(png, layout, row, 1).tolist() == [60 + 70 * row] * 3


def test_folds_are_captioned_and_default_split_is_the_first(tmp_path):
    data = _contract(tmp_path / "folds.h5", 1, [4, 4, 4], splits=("all",), folds=2)
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # keep text as text in the SVG
        out = preview_dataset(data, tmp_path / "grid.svg", per_class=4)
    svg = out.read_text()
    assert "split 'all'" in svg and "12 samples" in svg
    assert svg.count("fold 0") == 6 and svg.count("fold 1") == 6
    assert "n=4" in svg and "all-2-1" in svg and "no samples" not in svg


def test_names_with_dollars_are_captioned_as_written(tmp_path):
    """Two '$' made matplotlib draw the text between them as mathtext: '$5 ml$' was
    captioned '5 ml' in italics."""
    data = _contract(tmp_path / "d.h5", 1, [2, 2, 2], names=("$5 ml$", "$10 ml$", "b"),
                     groups="$case {c}$")
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        svg = preview_dataset(data, tmp_path / "grid.svg", per_class=2).read_text()
    shown = re.findall(r">([^<>]*)</text>", svg)  # mathtext is drawn glyph by glyph
    assert {"$5 ml$", "$10 ml$", "$case 1$"} <= set(shown)


def test_long_class_names_label_their_rows_apart(tmp_path):
    """A row label was the class name cut to 19 characters and '~': classes
    'adenocarcinoma_grade1' and 'adenocarcinoma_grade2' labelled two rows alike."""
    names = ("adenocarcinoma_grade1", "adenocarcinoma_grade2", "b")
    data = _contract(tmp_path / "long.h5", 1, [2, 2, 2], names=names)
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        svg = preview_dataset(data, tmp_path / "grid.svg", per_class=2).read_text()
    shown = "".join(re.findall(r">([^<>]*)</text>", svg))
    assert all(name + "n=2" in shown for name in names), shown


def test_same_seed_same_picture_on_the_tupac16_fixture(tiny_h5, tmp_path):
    a = preview_dataset(tiny_h5, tmp_path / "a.png", split="test", per_class=3, seed=1)
    b = preview_dataset(tiny_h5, tmp_path / "b.png", split="test", per_class=3, seed=1)
    png = imread(a)
    assert png.shape[:2] == GridLayout(rows=2, per_class=3).size[::-1]
    assert a.read_bytes() == b.read_bytes()
    layout = GridLayout(rows=2, per_class=3)
    left, top, right, bottom = layout.image_box(0, 0)
    assert png[top:bottom, left:right, :3].std() > 0.02  # a hematoxylin patch, not blank


def test_cli_preview_and_missing_split(tmp_path):
    data = _contract(tmp_path / "d.h5", 3, [3, 3, 3], splits=("train", "val"))
    out = tmp_path / "grid.png"
    result = runner.invoke(app, ["-q", "data", "preview", str(data), "-o", str(out),
                                 "--split", "val", "--per-class", "2"])
    assert result.exit_code == 0, result.output
    assert imread(out).shape[:2] == GridLayout(rows=3, per_class=2).size[::-1]
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        svg = preview_dataset(_contract(tmp_path / "e.h5", 3, [3, 0, 3]), tmp_path / "e.svg")
    assert svg.read_text().count("no samples") == 1

    missing = tmp_path / "none.png"
    result = runner.invoke(app, ["data", "preview", str(data), "-o", str(missing),
                                 "--split", "test"])
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {data}: has no 'test' split (has: train, val)"
    assert not missing.exists() and not list(tmp_path.glob(".none.png*"))


@pytest.mark.parametrize("args, message", [
    (["--per-class", "0"], "--per-class must be within 1..64"),
    (["--seed", "-1"], "--seed must be >= 0, got -1"),  # not 'the file is damaged'
    (["-o", "grid.xyz"], "unsupported image format 'xyz'"),
])
def test_bad_options(tmp_path, args, message):
    data = _contract(tmp_path / "d.h5", 1, [2, 2, 2])
    argv = ["data", "preview", str(data), *args]
    if "-o" not in args:
        argv += ["-o", str(tmp_path / "g.png")]
    result = runner.invoke(app, argv)
    assert result.exit_code == 1 and message in result.stderr
