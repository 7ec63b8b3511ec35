"""MNIST / Fashion-MNIST: IDX files, synthetic data, preprocessing and random40 placement."""

from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import groups_by_split, load_split, read_info
from capsmed.data.sources.mnist.idx import (
    encode_idx,
    read_idx,
    read_idx_images,
    read_idx_labels,
    write_idx,
)
from capsmed.data.sources.mnist.reader import (
    FASHION_CLASSES,
    MnistConfig,
    find_idx_files,
    place_on_canvas,
    preprocess_mnist,
    split_train_val,
)
from capsmed.data.sources.mnist.synth import write_mnist_like
from capsmed.errors import CapsmedError
from tests.helpers import assert_clean_failure

runner = CliRunner()


@pytest.fixture(scope="module")
def mnist_raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("mnist") / "raw"
    write_mnist_like(root, "mnist", train=120, test=40, seed=5)
    return root


def _idx(root, name):
    return root / f"{name}.gz"


def _all(path):
    return {s: load_split(path, s, with_meta=True) for s in read_info(path).split_sizes}


# ----------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("array", [
    np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
    np.array([7, 0, 9], dtype=np.uint8),
    np.array([[-300, 2], [5, 32000]], dtype=np.int16),
    np.array([1.5, -2.25], dtype=np.float32),
])
def test_idx_round_trip(tmp_path, array, suffix):
    path = write_idx(tmp_path / f"a.idx{suffix}", array)
    back = read_idx(path)
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    raw = gzip.decompress(path.read_bytes()) if suffix else path.read_bytes()
    assert raw == encode_idx(array)


def test_idx_header_is_the_mnist_one():
    images = encode_idx(np.zeros((5, 28, 28), np.uint8))
    labels = encode_idx(np.zeros(5, np.uint8))
    assert int.from_bytes(images[:4], "big") == 2051  # 0x0803: uint8, 3 dimensions
    assert int.from_bytes(labels[:4], "big") == 2049
    assert [int.from_bytes(images[4 + 4 * i:8 + 4 * i], "big") for i in range(3)] == [5, 28, 28]
    assert len(images) == 16 + 5 * 28 * 28


def test_gzip_is_deterministic(tmp_path):
    a = write_idx(tmp_path / "a.gz", np.arange(10, dtype=np.uint8))
    b = write_idx(tmp_path / "b.gz", np.arange(10, dtype=np.uint8))
    assert a.read_bytes() == b.read_bytes()


def test_wrong_magic_and_garbage(tmp_path):
    labels = write_idx(tmp_path / "labels", np.zeros(4, np.uint8))
    with pytest.raises(CapsmedError, match=r"labels: wrong magic number 2049, expected 2051"):
        read_idx_images(labels)
    images = write_idx(tmp_path / "images", np.zeros((2, 3, 3), np.uint8))
    with pytest.raises(CapsmedError, match="wrong magic number 2051, expected 2049"):
        read_idx_labels(images)
    junk = tmp_path / "junk"
    junk.write_bytes(b"<html>404 not found</html>")
    with pytest.raises(CapsmedError, match="junk: not an IDX file"):
        read_idx(junk)


def test_truncated_plain_and_gz(tmp_path):
    images = np.ones((3, 28, 28), np.uint8)
    plain = write_idx(tmp_path / "p", images)
    plain.write_bytes(plain.read_bytes()[:-100])
    with pytest.raises(CapsmedError, match=r"p: truncated: header says 3x28x28 uint8 "
                                           r"\(2,368 bytes\) but the data is 2,268 bytes"):
        read_idx_images(plain)
    plain.write_bytes(encode_idx(images) + b"\0")
    with pytest.raises(CapsmedError, match="trailing bytes"):
        read_idx_images(plain)
    gz = write_idx(tmp_path / "g.gz", images)
    gz.write_bytes(gz.read_bytes()[:20])
    with pytest.raises(CapsmedError, match="g.gz: corrupt or truncated gzip"):
        read_idx_images(gz)


# ------------------------------------------------------------------ files and synth


def test_finds_plain_dotted_and_torchvision_layouts(tmp_path, mnist_raw):
    plain = tmp_path / "plain"
    plain.mkdir()
    for gz in mnist_raw.glob("*.gz"):
        (plain / gz.name[:-3].replace("-idx", ".idx")).write_bytes(gzip.decompress(
            gz.read_bytes()))
    found = find_idx_files(plain)
    assert found["train"][0].name == "train-images.idx3-ubyte"
    tv = tmp_path / "tv"
    shutil.copytree(mnist_raw, tv / "MNIST" / "raw")
    assert find_idx_files(tv)["t10k"][1] == tv / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz"
    (tv / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(CapsmedError, match=r"missing .*t10k-labels-idx1-ubyte\[.gz\]"):
        find_idx_files(tv)


def test_a_torchvision_root_gives_each_dataset_its_own_folder(tmp_path, mnist_raw):
    """torchvision keeps MNIST/raw and FashionMNIST/raw under one root, with the same
    file names: fashion-mnist must not take the first folder that has four files."""
    root = tmp_path / "data"
    shutil.copytree(mnist_raw, root / "MNIST" / "raw")
    shutil.copytree(mnist_raw, root / "FashionMNIST" / "raw")
    assert find_idx_files(root, "fashion-mnist")["train"][0].parent == root / "FashionMNIST" / "raw"
    assert find_idx_files(root, "mnist")["train"][0].parent == root / "MNIST" / "raw"
    shutil.rmtree(root / "FashionMNIST")
    with pytest.raises(CapsmedError, match="capsmed fetch fashion-mnist"):
        find_idx_files(root, "fashion-mnist")


def test_the_published_files_of_the_other_dataset_are_refused(tmp_path, mnist_raw,
                                                              monkeypatch):
    from dataclasses import replace

    from capsmed.data.fetch import file_md5
    from capsmed.data.sources.mnist import reader as mnist

    # pretend the synthetic files are the published MNIST ones
    md5 = {p.name: file_md5(p) for p in mnist_raw.glob("*.gz")}
    monkeypatch.setitem(mnist.REMOTE, "mnist", replace(mnist.REMOTE["mnist"], md5=md5))
    out = tmp_path / "fashion.h5"
    result = runner.invoke(app, ["preprocess", "fashion-mnist", str(mnist_raw), "-o", str(out)])
    assert_clean_failure(result, "this is the published mnist file, not fashion-mnist", out)
    result = runner.invoke(app, ["-q", "preprocess", "mnist", str(mnist_raw), "-o", str(out),
                                 "--val", "10"])
    assert result.exit_code == 0, result.output
    assert read_info(out).source["official_files"] is True


def test_published_train_and_t10k_files_swapped_are_refused(tmp_path, mnist_raw,
                                                            monkeypatch):
    from dataclasses import replace

    from capsmed.data.fetch import file_md5
    from capsmed.data.sources.mnist import reader as mnist

    # pretend the synthetic files are the published MNIST ones, then swap train and t10k:
    # read as they are, the 40 test images became the training set without a word
    md5 = {p.name: file_md5(p) for p in mnist_raw.glob("*.gz")}
    monkeypatch.setitem(mnist.REMOTE, "mnist", replace(mnist.REMOTE["mnist"], md5=md5))
    raw = tmp_path / "raw"
    raw.mkdir()
    for kind in ("images-idx3", "labels-idx1"):
        shutil.copy(mnist_raw / f"train-{kind}-ubyte.gz", raw / f"t10k-{kind}-ubyte.gz")
        shutil.copy(mnist_raw / f"t10k-{kind}-ubyte.gz", raw / f"train-{kind}-ubyte.gz")
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["preprocess", "mnist", str(raw), "-o", str(out),
                                 "--val", "10"])
    assert_clean_failure(result, str(raw / "train-images-idx3-ubyte.gz"), out)
    assert "published mnist file t10k-images-idx3-ubyte.gz, not train-images" in result.stderr


def test_synth_is_deterministic_balanced_and_learnable(tmp_path):
    a = write_mnist_like(tmp_path / "a", "fashion-mnist", train=200, test=50, seed=3)
    b = write_mnist_like(tmp_path / "b", "fashion-mnist", train=200, test=50, seed=3,
                         compress=False)
    for fa, fb in zip(a.files, b.files, strict=True):
        assert fa.name == fb.name + ".gz"
        np.testing.assert_array_equal(read_idx(fa), read_idx(fb))
    x = read_idx_images(a.root / "train-images-idx3-ubyte.gz").reshape(200, -1).astype(float)
    y = read_idx_labels(a.root / "train-labels-idx1-ubyte.gz")
    xt = read_idx_images(a.root / "t10k-images-idx3-ubyte.gz").reshape(50, -1).astype(float)
    yt = read_idx_labels(a.root / "t10k-labels-idx1-ubyte.gz")
    assert np.bincount(y, minlength=10).tolist() == [20] * 10
    # Class-distinguishable: a 1-nearest-neighbour on raw pixels is far above chance (0.1).
    nearest = ((xt[:, None] - x[None]) ** 2).sum(-1).argmin(1)
    assert (y[nearest] == yt).mean() > 0.6


# ---------------------------------------------------------------------- preprocess


def test_preprocess_counts_splits_and_contents(tmp_path, mnist_raw):
    out = preprocess_mnist(mnist_raw, tmp_path / "m.h5", MnistConfig(val=20, seed=1))
    info = read_info(out)
    assert info.split_sizes == {"train": 100, "val": 20, "test": 40}
    assert info.class_names == tuple("0123456789") and info.image_size == (28, 28)
    assert info.preprocessing["val_count"] == 20 and info.source["official_files"] is False
    train_x = read_idx_images(_idx(mnist_raw, "train-images-idx3-ubyte"))
    train_y = read_idx_labels(_idx(mnist_raw, "train-labels-idx1-ubyte"))
    test_x = read_idx_images(_idx(mnist_raw, "t10k-images-idx3-ubyte"))
    splits = _all(out)
    # train + val are exactly the training file, disjoint; test is t10k in order
    idx = np.concatenate([splits["train"].meta["index"], splits["val"].meta["index"]])
    assert sorted(idx.tolist()) == list(range(120))
    for name in ("train", "val"):
        s = splits[name]
        np.testing.assert_array_equal(s.images[:, 0], train_x[s.meta["index"]])
        np.testing.assert_array_equal(s.labels, train_y[s.meta["index"]])
        assert s.groups[0] == f"train-{s.meta['index'][0]:06d}"
    np.testing.assert_array_equal(splits["test"].images[:, 0], test_x)
    assert splits["test"].groups[3] == "t10k-000003"
    groups = groups_by_split(out)
    assert not groups["train"] & groups["val"]
    assert len(groups["train"]) == 100  # one group per image


def test_preprocess_is_deterministic_and_seeded(tmp_path, mnist_raw):
    cfg = MnistConfig(val=0.25, placement="random40", seed=4)
    a = _all(preprocess_mnist(mnist_raw, tmp_path / "a.h5", cfg))
    b = _all(preprocess_mnist(mnist_raw, tmp_path / "b.h5", cfg))
    c = _all(preprocess_mnist(mnist_raw, tmp_path / "c.h5", MnistConfig(val=0.25, seed=5)))
    for split in a:
        np.testing.assert_array_equal(a[split].images, b[split].images)
        np.testing.assert_array_equal(a[split].groups, b[split].groups)
    assert len(a["val"]) == 30
    assert set(a["val"].groups) != set(c["val"].groups)
    train, val = split_train_val(1000, 100, seed=9)
    assert len(val) == 100 and len(train) == 900 and not set(train) & set(val)


def test_fashion_class_names(tmp_path):
    raw = tmp_path / "f"
    write_mnist_like(raw, "fashion-mnist", train=30, test=10, seed=0)
    out = preprocess_mnist(raw, tmp_path / "f.h5", MnistConfig(dataset="fashion-mnist", val=0))
    info = read_info(out)
    assert info.class_names == FASHION_CLASSES and info.class_names[9] == "Ankle boot"
    assert info.split_sizes == {"train": 30, "test": 10}


def test_random40_keeps_whole_digit_and_positions_vary(tmp_path, mnist_raw):
    out = preprocess_mnist(mnist_raw, tmp_path / "r.h5",
                           MnistConfig(val=20, placement="random40", seed=2))
    assert read_info(out).image_size == (40, 40)
    sources = {"train": read_idx_images(_idx(mnist_raw, "train-images-idx3-ubyte")),
               "t10k": read_idx_images(_idx(mnist_raw, "t10k-images-idx3-ubyte"))}
    for split, data in _all(out).items():
        oy, ox = data.meta["offset_y"].astype(int), data.meta["offset_x"].astype(int)
        assert oy.min() >= 0 and ox.min() >= 0 and oy.max() <= 12 and ox.max() <= 12
        src = sources["t10k" if split == "test" else "train"][data.meta["index"]]
        for img, s, y, x in zip(data.images[:, 0], src, oy, ox, strict=True):
            np.testing.assert_array_equal(img[y:y + 28, x:x + 28], s)  # the whole digit
            assert int(img.sum()) == int(s.sum())  # and nothing else on the canvas
        assert len(set(zip(oy.tolist(), ox.tolist(), strict=True))) > len(oy) // 2
    # over all images, corners reach both canvas edges
    train = load_split(out, "train", with_meta=True)
    assert {0, 12} <= set(train.meta["offset_y"].tolist()) | set(train.meta["offset_x"].tolist())


def test_place_on_canvas_vectorised_and_center40(tmp_path, mnist_raw):
    images = np.arange(2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 3) + 1
    canvas = place_on_canvas(images, np.array([[0, 0], [3, 2]]), 5)
    np.testing.assert_array_equal(canvas[1, 3:5, 2:5], images[1])
    assert canvas[0, 2:].sum() == 0 and canvas.sum() == images.sum()
    with pytest.raises(ValueError, match="outside"):
        place_on_canvas(images, np.array([[0, 0], [4, 0]]), 5)
    out = preprocess_mnist(mnist_raw, tmp_path / "c.h5", MnistConfig(val=0, placement="center40"))
    test = load_split(out, "test", with_meta=True)
    assert (test.meta["offset_y"] == 6).all() and (test.meta["offset_x"] == 6).all()


# ------------------------------------------------------------------------------ CLI


def test_cli_synth_then_preprocess(tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "m.h5"
    result = runner.invoke(app, ["-q", "synth", "mnist", str(raw), "--train", "40", "--test",
                                 "10", "--seed", "2", "--no-gzip"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in raw.iterdir()) == [
        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte"]
    result = runner.invoke(app, ["-q", "preprocess", "mnist", str(raw), "-o", str(out),
                                 "--val", "8", "--placement", "random40", "--seed", "3"])
    assert result.exit_code == 0, result.output
    info = read_info(out)
    assert info.split_sizes == {"train": 32, "val": 8, "test": 10}
    assert info.preprocessing["placement"] == "random40" and info.preprocessing["seed"] == 3


def _truncate_images(raw):
    victim = raw / "train-images-idx3-ubyte.gz"
    victim.write_bytes(gzip.compress(gzip.decompress(victim.read_bytes())[:5000]))
    return victim, "truncated: header says 120x28x28"


def _labels_as_images(raw):
    victim = raw / "t10k-images-idx3-ubyte.gz"
    shutil.copy(raw / "t10k-labels-idx1-ubyte.gz", victim)
    return victim, "wrong magic number 2049, expected 2051"


def _too_few_labels(raw):
    victim = raw / "train-labels-idx1-ubyte.gz"
    write_idx(victim, np.zeros(100, np.uint8))
    return victim, "100 labels but train-images-idx3-ubyte.gz holds 120 images"


def _label_out_of_range(raw):
    victim = raw / "t10k-labels-idx1-ubyte.gz"
    write_idx(victim, np.full(40, 10, np.uint8))
    return victim, "label 10 outside 0..9"


@pytest.mark.parametrize("corrupt", [_truncate_images, _labels_as_images, _too_few_labels,
                                     _label_out_of_range])
def test_cli_bad_idx_files(tmp_path, mnist_raw, corrupt):
    raw = tmp_path / "raw"
    shutil.copytree(mnist_raw, raw)
    victim, message = corrupt(raw)
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["preprocess", "mnist", str(raw), "-o", str(out)])
    assert_clean_failure(result, str(victim), out)
    assert message in result.stderr


def test_cli_missing_files_and_bad_options(tmp_path, mnist_raw):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["preprocess", "fashion-mnist", str(empty), "-o", str(out)])
    assert_clean_failure(result, str(empty), out)
    assert "capsmed fetch fashion-mnist" in result.stderr
    result = runner.invoke(app, ["preprocess", "mnist", str(mnist_raw), "-o", str(out),
                                 "--placement", "random50"])
    assert_clean_failure(result, "random50", out)
    result = runner.invoke(app, ["preprocess", "mnist", str(mnist_raw), "-o", str(out),
                                 "--val", "120"])
    assert_clean_failure(result, "leaves no training images", out)


def test_unpacked_train_and_t10k_files_swapped_are_refused(tmp_path):
    # unpacked files have no published checksum: the published counts tell the swap
    raw = tmp_path / "raw"
    for prefix, n in (("train", 10_000), ("t10k", 60_000)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", np.zeros((n, 2, 2), np.uint8))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", (np.arange(n) % 10).astype(np.uint8))
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["preprocess", "fashion-mnist", str(raw), "-o", str(out)])
    assert_clean_failure(result, str(raw / "train-images-idx3-ubyte"), out)
    assert "train and t10k files swapped" in result.stderr


def _unpacked_raw(raw, class_counts):
    for prefix in ("train", "t10k"):
        labels = np.repeat(np.arange(10), class_counts[prefix]).astype(np.uint8)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", np.zeros((len(labels), 2, 2), np.uint8))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return raw


@pytest.mark.parametrize(("given", "files"), [("mnist", "fashion-mnist"),
                                               ("fashion-mnist", "mnist")])
def test_unpacked_files_of_the_other_dataset_are_refused(tmp_path, given, files):
    # unpacked files have no published checksum, the same file names and counts per
    # file: Fashion-MNIST given as MNIST was preprocessed under digit names, silently
    from capsmed.data.sources.mnist.reader import PUBLISHED_CLASS_COUNTS

    raw = _unpacked_raw(tmp_path / "raw", PUBLISHED_CLASS_COUNTS[files])
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["preprocess", given, str(raw), "-o", str(out)])
    assert_clean_failure(result, str(raw / "train-labels-idx1-ubyte"), out)
    assert f"count per class as the published {files} files, not {given}" in result.stderr


def test_unpacked_files_of_the_named_dataset_are_read(tmp_path):
    from capsmed.data.sources.mnist.reader import PUBLISHED_CLASS_COUNTS, load_mnist_splits

    raw = _unpacked_raw(tmp_path / "raw", PUBLISHED_CLASS_COUNTS["mnist"])
    splits, _ = load_mnist_splits(raw, "mnist", val=0.1, seed=0)
    assert sum(len(s) for s in splits.values()) == 70_000
