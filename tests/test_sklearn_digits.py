"""scikit-learn's real digit scans as a dataset: every image once, stratified splits,
MNIST framing, the digits domain (never flipped), and a refused bad configuration."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from sklearn.datasets import load_digits
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import load_split, read_info, read_meta
from capsmed.data.sources.digits.config import DigitsConfig
from capsmed.errors import CapsmedError


@pytest.fixture(scope="module")
def digits_h5(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits") / "digits.h5"
    result = CliRunner().invoke(app, ["-q", "preprocess", "digits", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_every_scan_once_in_stratified_splits(digits_h5):
    info = read_info(digits_h5)
    assert info.split_sizes == {"train": 1078, "val": 180, "test": 539}
    assert info.image_domain().name == "digits" and info.data_source().name == "digits"
    rows = np.concatenate([read_meta(digits_h5, s, "index") for s in info.split_sizes])
    assert np.array_equal(np.sort(rows), np.arange(1797))
    target = load_digits().target
    for split, share in (("train", 0.6), ("test", 0.3)):
        counts = np.bincount(load_split(digits_h5, split).labels, minlength=10)
        assert np.all(np.abs(counts - share * np.bincount(target)) <= 1)


def test_a_scan_is_enlarged_and_centred_like_mnist(digits_h5):
    split = load_split(digits_h5, "test")
    index = read_meta(digits_h5, "test", "index")
    bunch = load_digits()
    k = 5
    scan = np.rint(bunch.images[index[k]] * 255 / 16).astype(np.uint8)
    assert split.labels[k] == bunch.target[index[k]]
    image = split.images[k, 0]
    assert np.array_equal(image[4:24, 4:24], cv2.resize(scan, (20, 20),
                                                        interpolation=cv2.INTER_LINEAR))
    frame = image.copy()
    frame[4:24, 4:24] = 0
    assert not frame.any()  # black outside the 20x20 box, strokes light on black


def test_bad_sizes_are_refused():
    with pytest.raises(CapsmedError, match="box <= size"):
        DigitsConfig(size=16, box=20)
    with pytest.raises(CapsmedError, match="sum to 1"):
        DigitsConfig(fractions={"train": 0.9, "val": 0.2, "test": 0.1})


def test_predict_reads_a_scan_as_the_set_made_its_images(digits_h5, tmp_path):
    """An 8x8 scan saved as a PNG becomes the stored image exactly (it was stretched
    over the whole canvas, a digit the model never saw); a stored image is kept."""
    from capsmed.data.record import DatasetRecord
    from capsmed.data.replay import make_recipe
    from capsmed.data.replay.options import Overrides

    recipe = make_recipe(DatasetRecord.from_info(read_info(digits_h5)), Overrides())
    split, index = load_split(digits_h5, "test"), read_meta(digits_h5, "test", "index")
    scan = np.rint(load_digits().images[index[3]] * 255 / 16).astype(np.uint8)
    cv2.imwrite(str(tmp_path / "scan.png"), scan)
    cv2.imwrite(str(tmp_path / "stored.png"), split.images[3, 0])
    for name in ("scan.png", "stored.png"):
        images, _ = next(recipe.prepare(tmp_path / name, None).chunks)
        np.testing.assert_array_equal(images[0], split.images[3], err_msg=name)
    cv2.imwrite(str(tmp_path / "big.png"), cv2.resize(scan, (64, 64)))  # boxed, centred
    images, _ = next(recipe.prepare(tmp_path / "big.png", None).chunks)
    assert not images[0, 0, :4].any() and images[0, 0, 4:24, 4:24].any()
