"""affNIST (.mat reading, orientation) and MultiMNIST (Sabour et al.'s generation)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import scipy.io
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import DatasetWriter, load_split, read_info
from capsmed.data.sources.mnist.affnist import AffnistConfig, preprocess_affnist, read_affnist_mat
from capsmed.data.sources.mnist.idx import read_idx_images
from capsmed.data.sources.mnist.multimnist import (
    MultiMnistConfig,
    draw_partners,
    overlay,
    preprocess_multimnist,
)
from capsmed.data.sources.mnist.reader import MnistConfig, place_on_canvas, preprocess_mnist
from capsmed.data.sources.mnist.synth import write_affnist, write_affnist_mat, write_mnist_like
from capsmed.errors import CapsmedError
from tests.helpers import assert_clean_failure

runner = CliRunner()


def _asymmetric(n=3):
    """Images whose transposes and flips all differ: an 'F' plus a per-image marker."""
    images = np.zeros((n, 40, 40), np.uint8)
    images[:, 5:35, 8] = 200  # the stem
    images[:, 5, 8:30] = 220  # top bar
    images[:, 18, 8:22] = 240  # middle bar
    for k in range(n):
        images[k, 30, 30 + k] = 255
    return images


# --------------------------------------------------------------------------- affNIST


@pytest.mark.parametrize("version", ["5", "7.3"])
def test_affnist_orientation_round_trip(tmp_path, version):
    images, labels = _asymmetric(), np.array([3, 7, 0])
    path = write_affnist_mat(tmp_path / "x.mat", images, labels, version)
    back, back_labels = read_affnist_mat(path)
    np.testing.assert_array_equal(back, images)
    np.testing.assert_array_equal(back_labels, labels)
    if version == "5":
        # The real files' convention: column n holds image n's rows in order, so a
        # MATLAB-style (column-major) reshape shows the digit transposed.
        column = scipy.io.loadmat(path)["affNISTdata"]["image"][0, 0][:, 1]
        assert column.shape == (1600,)
        np.testing.assert_array_equal(column.reshape(40, 40), images[1])
        np.testing.assert_array_equal(column.reshape(40, 40, order="F"), images[1].T)
        assert not np.array_equal(images[1], images[1].T)


def test_affnist_whole_file_and_batches_agree(tmp_path):
    raw = write_affnist(tmp_path / "aff", count=30, batches=4, seed=1).root
    assert sorted(p.name for p in (raw / "test_batches").iterdir()) == [
        "1.mat", "2.mat", "3.mat", "4.mat"]
    whole = preprocess_affnist(raw / "test.mat", tmp_path / "w.h5")
    batched = preprocess_affnist(raw / "test_batches", tmp_path / "b.h5")
    info = read_info(whole)
    assert info.dataset == "affnist" and info.split_sizes == {"test": 30}
    assert info.image_size == (40, 40) and info.class_names == tuple("0123456789")
    a = load_split(whole, "test", with_meta=True)
    b = load_split(batched, "test", with_meta=True)
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert np.bincount(a.labels).tolist() == [3] * 10
    assert a.groups[0] == "affnist-test-000000" and b.groups[-1] == "affnist-4-000006"
    assert b.meta["source"][8] == "2.mat" and b.meta["index"][8] == 0
    # digits stay whole inside the frame (no bright ink on its border), and are warped
    # and moved: most have ink outside the central 28x28 box that padding alone fills
    x = a.images[:, 0].astype(int)
    border = np.concatenate([x[:, 0], x[:, -1], x[:, :, 0], x[:, :, -1]], axis=1)
    assert border.max() <= 128
    outside = x.copy()
    outside[:, 6:34, 6:34] = 0
    assert (outside.sum(axis=(1, 2)) > 0).mean() > 0.5
    limited = load_split(preprocess_affnist(raw / "test_batches", tmp_path / "l.h5",
                                            AffnistConfig(max_images=10)), "test")
    np.testing.assert_array_equal(limited.images, a.images[:10])


def test_affnist_batches_follow_the_shared_file_rules(tmp_path):
    """3.MAT is a batch; a hidden .1.mat copy is not; 1.mat and 1.MAT are refused."""
    raw = write_affnist(tmp_path / "aff", count=30, batches=4, seed=1).root
    batches = raw / "test_batches"
    want = load_split(preprocess_affnist(batches, tmp_path / "a.h5"), "test")
    (batches / "3.mat").rename(batches / "3.MAT")
    shutil.copy(batches / "1.mat", batches / ".1.mat")
    got = load_split(preprocess_affnist(batches, tmp_path / "b.h5"), "test")
    np.testing.assert_array_equal(got.images, want.images)
    shutil.copy(batches / "1.mat", batches / "1.MAT")
    with pytest.raises(CapsmedError, match="also present as"):
        preprocess_affnist(batches, tmp_path / "c.h5")
    assert not (tmp_path / "c.h5").exists()


def test_affnist_synth_is_deterministic(tmp_path):
    a = write_affnist(tmp_path / "a", count=12, batches=2, seed=4)
    b = write_affnist(tmp_path / "b", count=12, batches=2, seed=4)
    np.testing.assert_array_equal(read_affnist_mat(a.files[0])[0], read_affnist_mat(b.files[0])[0])


def _struct_without_labels(path):
    scipy.io.savemat(path, {"affNISTdata": {"image": np.zeros((1600, 2), np.uint8)}})
    return "affNISTdata has no field 'label_int'"


def _mnist_sized(path):
    scipy.io.savemat(path, {"affNISTdata": {"image": np.zeros((784, 2), np.uint8),
                                            "label_int": np.zeros((1, 2), np.uint8)}})
    return "affNISTdata.image is 784x2, expected 1600 x N"


def _other_variable(path):
    scipy.io.savemat(path, {"data": np.zeros(3)})
    return "no 'affNISTdata' struct (found: data)"


def _not_a_mat(path):
    path.write_bytes(b"PK\x03\x04 this is the zip, not the .mat inside")
    return "cannot read MATLAB file"


@pytest.mark.parametrize("make", [_struct_without_labels, _mnist_sized, _other_variable,
                                  _not_a_mat])
def test_cli_bad_affnist_files(tmp_path, make):
    victim = tmp_path / "test.mat"
    message = make(victim)
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "affnist", str(victim), "-o", str(out)])
    assert_clean_failure(result, str(victim), out)
    assert message in result.stderr


def test_cli_affnist_empty_folder_and_synth(tmp_path):
    empty = tmp_path / "batches"
    empty.mkdir()
    out = tmp_path / "out.h5"
    assert_clean_failure(runner.invoke(app, ["preprocess", "affnist", str(empty), "-o",
                                              str(out)]), str(empty), out)
    raw = tmp_path / "aff"
    result = runner.invoke(app, ["-q", "synth", "affnist", str(raw), "--count", "20",
                                 "--batches", "2", "--mat-version", "7.3"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["-q", "preprocess", "affnist", str(raw / "test_batches"),
                                 "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert read_info(out).split_sizes == {"test": 20}


# ------------------------------------------------------------------------ MultiMNIST


@pytest.fixture(scope="module")
def mnist_raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("mm") / "raw"
    write_mnist_like(root, "mnist", train=60, test=20, seed=8)
    return root


@pytest.fixture(scope="module")
def multi(mnist_raw, tmp_path_factory):
    out = tmp_path_factory.mktemp("mmh5") / "mm.h5"
    cfg = MultiMnistConfig(pairs=3, eval_pairs=2, val=10, seed=6)
    return preprocess_multimnist(mnist_raw, out, cfg)


def _splits(path):
    return {s: load_split(path, s, with_meta=True) for s in read_info(path).split_sizes}


def test_multimnist_counts_and_two_classes(multi):
    info = read_info(multi)
    assert info.split_sizes == {"train": 150, "val": 20, "test": 40}
    assert info.image_size == (36, 36) and info.preprocessing["merge"] == "min(a+b,255)"
    for data in _splits(multi).values():
        assert (data.labels != data.meta["label2"]).all()
        assert data.meta["image_a"].shape == (len(data), 1, 36, 36)
        assert data.meta["image_b"].dtype == np.uint8


def test_multimnist_overlay_sources_and_shifts(multi, mnist_raw):
    sources = {"train": read_idx_images(mnist_raw / "train-images-idx3-ubyte.gz"),
               "t10k": read_idx_images(mnist_raw / "t10k-images-idx3-ubyte.gz")}
    for data in _splits(multi).values():
        a, b = data.meta["image_a"][:, 0], data.meta["image_b"][:, 0]
        expected = np.minimum(a.astype(int) + b, 255)
        np.testing.assert_array_equal(data.images[:, 0], expected)
        assert (data.images[:, 0] == 255).sum() >= ((a.astype(int) + b) > 255).sum() > 0
        for key, img in (("a", a), ("b", b)):
            shifts = data.meta[f"shift_{key}"].astype(int)
            assert shifts.min() >= -4 and shifts.max() <= 4
            ids = data.meta[f"source_{key}"]
            src = np.stack([sources[i.split("-")[0]][int(i.split("-")[1])] for i in ids])
            np.testing.assert_array_equal(img, place_on_canvas(src, 4 + shifts, 36))
        all_shifts = np.concatenate([data.meta["shift_a"], data.meta["shift_b"]])
        assert len(np.unique(all_shifts, axis=0)) > 5
    assert overlay(np.array([200, 10], np.uint8), np.array([100, 20], np.uint8)).tolist() == [
        255, 30]


def test_multimnist_pairs_stay_within_their_split(multi, mnist_raw, tmp_path):
    # The same val sample as preprocess mnist with the same --val and --seed.
    plain = preprocess_mnist(mnist_raw, tmp_path / "m.h5", MnistConfig(val=10, seed=6))
    members = {s: set(load_split(plain, s).groups) for s in ("train", "val", "test")}
    for split, data in _splits(multi).items():
        assert set(data.meta["source_a"]) == members[split]  # every image is a first digit
        assert set(data.meta["source_b"]) <= members[split]
        np.testing.assert_array_equal(data.groups, data.meta["source_a"])
        k = 3 if split == "train" else 2
        assert np.unique(data.groups, return_counts=True)[1].tolist() == [k] * len(
            members[split])


def test_multimnist_is_deterministic_and_optional_sources(multi, mnist_raw, tmp_path):
    again = preprocess_multimnist(mnist_raw, tmp_path / "again.h5",
                                  MultiMnistConfig(pairs=3, eval_pairs=2, val=10, seed=6))
    first, second = _splits(multi), _splits(again)
    for split in first:
        np.testing.assert_array_equal(first[split].images, second[split].images)
        np.testing.assert_array_equal(first[split].meta["source_b"],
                                      second[split].meta["source_b"])
    out = tmp_path / "small.h5"
    result = runner.invoke(app, ["-q", "preprocess", "multimnist", str(mnist_raw), "-o",
                                 str(out), "--pairs", "1", "--val", "0", "--shift", "2",
                                 "--no-store-sources"])
    assert result.exit_code == 0, result.output
    data = load_split(out, "train", with_meta=True)
    assert "image_a" not in data.meta and len(data) == 60
    assert read_info(out).image_size == (32, 32)


def test_draw_partners_is_uniform_over_other_classes():
    labels = np.array([0, 0, 1, 2, 2, 2])
    rng = np.random.default_rng(0)
    first = np.repeat(np.arange(6), 2000)
    partner = draw_partners(labels, first, rng)
    assert (labels[partner] != labels[first]).all()
    # image 0 (class 0) pairs with images 2..5 about equally often
    counts = np.bincount(partner[first == 0], minlength=6)
    assert counts[:2].sum() == 0 and counts[2:].min() > 400
    with pytest.raises(CapsmedError, match="two classes"):
        draw_partners(np.zeros(4, np.int64), np.arange(4), rng)


def test_two_digit_hits_on_hand_made_scores():
    from capsmed.evaluate.analyses.common import two_digit_hits

    scores = np.array([[0.9, 0.8, 0.1], [0.9, 0.1, 0.8], [0.1, 0.2, 0.9]])
    both, a, b = two_digit_hits(scores, np.array([0, 0, 2]), np.array([1, 1, 0]))
    assert both.tolist() == [True, False, False]
    assert a.tolist() == [True, True, True] and b.tolist() == [True, False, False]


def test_multimnist_trains_on_both_digits_and_reports_two_digit_accuracy(multi, tmp_path,
                                                                         monkeypatch):
    """Sabour et al.'s protocol end to end: two targets, each digit reconstructed from its
    own capsule, then two-digit accuracy on the test pairs."""
    import json

    import capsmed.train.losses as losses
    import capsmed.train.step as step_module
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train
    from tests.helpers import TINY_CAPSNET

    seen = []
    real = losses.two_label_loss

    def spy(kind, out, target, recon_weight, decoder, **rest):
        seen.append((target.first.clone(), target.second.clone(),
                     target.image_a is not None, decoder is not None))
        return real(kind, out, target, recon_weight, decoder, **rest)

    monkeypatch.setattr(step_module, "two_label_loss", spy)
    run = train(TrainConfig(data=str(multi), arch="capsnet", epochs=1, batch_size=16,
                            out=str(tmp_path / "mm"), model_kwargs=TINY_CAPSNET),
                disable_progress=True)
    monkeypatch.undo()
    first, second, has_sources, has_decoder = seen[0]
    assert (first != second).all() and has_sources and has_decoder
    metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert 0.0 <= metrics["train_acc"] <= 1.0 and np.isfinite(metrics["val_loss"])

    result = runner.invoke(app, ["-q", "analyze", "multimnist", str(run)])
    assert result.exit_code == 0, result.output
    report = json.loads((run / "analysis" / "multimnist" / "multimnist.json").read_text())
    test = load_split(multi, "test", with_meta=True)
    assert report["samples"] == len(test)
    # the file and weights scored, as the other analyses record them
    assert report["data"] == str(multi) and report["checkpoint_epoch"] == 1
    assert report["two_digit_accuracy"] <= min(report["first_found"], report["second_found"])
    # capsmed evaluate's per-class table scores the first digit; it says so and gives
    # the two-digit accuracy beside it (it once reported first-digit accuracy unsaid)
    result = runner.invoke(app, ["evaluate", str(run), "--no-grids"])
    assert result.exit_code == 0, result.output
    assert "two labels per image (label2)" in " ".join(result.stderr.split())
    evaluated = json.loads((run / "report" / "report.json").read_text())
    assert evaluated["two_label"]["two_digit_accuracy"] == report["two_digit_accuracy"]
    assert "first digit of two" in (run / "report" / "report.md").read_text()
    # two digits per image: transfer scores both in the top two (its base B is this run
    # on this test split, so it must equal analyze multimnist's figure); affine, which
    # scores one class per image, refuses the file
    tiny = [x for k, v in TINY_CAPSNET.items() for x in ("--model-arg", f"{k}={json.dumps(v)}")]
    result = runner.invoke(app, ["-q", "analyze", "transfer", "--a", str(multi), "--b",
                                 str(multi), "--base-a", str(run), "--base-b", str(run),
                                 "--layers", "conv.0", "--out", str(tmp_path / "tr"),
                                 "--epochs", "1", "--batch-size", "16",
                                 "--steps-per-epoch", "1", *tiny])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "tr" / "analysis" / "transfer" / "transfer.json"
                         ).read_text())
    assert record["results"][0]["accuracy"] == report["two_digit_accuracy"]
    result = runner.invoke(app, ["-q", "analyze", "affine", str(run)])
    assert result.exit_code == 1 and "two labels per image" in result.stderr
    info, dup = read_info(multi), tmp_path / "dup.h5"  # a hand-made file, same class twice
    with DatasetWriter(dup, dataset="multimnist", kind="multimnist", domain="digits",
                       class_names=list(info.class_names),
                       image_shape=(info.channels, *info.image_size), preprocessing={},
                       source={}) as w:
        w.append("test", test.images[:2], np.array([1, 2]), np.array(["g0", "g1"]),
                 meta={"label2": np.array([1, 3])})
    result = runner.invoke(app, ["-q", "analyze", "multimnist", str(run), "--data", str(dup)])
    assert result.exit_code == 1 and "(labels, meta/label2) are the same class" in \
        result.stderr
    # evaluate once scored such rows (and filed a report); it refuses them like training
    result = runner.invoke(app, ["-q", "evaluate", str(run), "--data", str(dup),
                                 "--no-grids", "--report-name", "dup"])
    assert result.exit_code == 1 and "are the same class" in result.stderr
    assert not (run / "dup").exists()
    with pytest.raises(CapsmedError, match="does not support --augment"):
        train(TrainConfig(data=str(multi), arch="capsnet", augment=True,
                          out=str(tmp_path / "no"), model_kwargs=TINY_CAPSNET))
    assert not (tmp_path / "no").exists()


def test_affnist_folder_holds_only_one_sets_numbered_batches(tmp_path):
    """Whole files unpacked side by side (training.mat, test.mat) are not batches of one
    set: read as a folder, the training images went into the test split."""
    raw = write_affnist(tmp_path / "aff", count=12, batches=3, seed=1).root
    shutil.copy(raw / "test.mat", raw / "training.mat")
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "affnist", str(raw), "-o", str(out)])
    assert_clean_failure(result, str(raw / "test.mat"), out)
    assert "not a numbered affNIST batch" in result.stderr
    batches = raw / "test_batches"
    (batches / "2.mat").unlink()
    result = runner.invoke(app, ["-q", "preprocess", "affnist", str(batches), "-o", str(out)])
    assert_clean_failure(result, str(batches), out)
    assert "not 1.mat to 2.mat (found 1.mat, 3.mat)" in result.stderr
    (batches / "1.mat").unlink()
    (batches / "3.mat").rename(batches / "test.mat")  # one whole file in a folder is read
    got = load_split(preprocess_affnist(batches, tmp_path / "one.h5"), "test")
    assert len(got.labels) == 4


def test_affnist_files_named_as_another_set_are_refused(tmp_path):
    """training_batches/ or training.mat went silently into the default split 'test': a
    model was then scored on transforms of the MNIST digits it was trained on."""
    raw = write_affnist(tmp_path / "aff", count=8, batches=2, seed=2).root
    training = raw / "training_batches"
    shutil.copytree(raw / "test_batches", training)
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "affnist", str(training), "-o", str(out)])
    assert_clean_failure(result, str(training / "1.mat"), out)
    assert "affNIST's training set, but the split is 'test' (pass --split train)" in (
        result.stderr)
    shutil.copy(raw / "test.mat", tmp_path / "validation.mat")
    with pytest.raises(CapsmedError, match="validation set, but the split is 'test'"):
        preprocess_affnist(tmp_path / "validation.mat", out)
    assert not out.exists()
    # the split the name says is taken, as is a name that says no set
    stored = preprocess_affnist(training, out, AffnistConfig(split="train"))
    assert read_info(stored).split_sizes == {"train": 8}
    shutil.copy(raw / "test.mat", tmp_path / "mine.mat")
    assert read_info(preprocess_affnist(tmp_path / "mine.mat", tmp_path / "m.h5")
                     ).split_sizes == {"test": 8}


def test_mnist_test_file_copied_from_the_training_file_is_refused(mnist_raw, tmp_path):
    """t10k files that are copies of the training files made every test pair out of
    training digits, without a word (unpublished files have no checksum to tell)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("images-idx3-ubyte.gz", "labels-idx1-ubyte.gz"):
        shutil.copy(mnist_raw / f"train-{name}", raw / f"train-{name}")
        shutil.copy(mnist_raw / f"train-{name}", raw / f"t10k-{name}")
    with pytest.raises(CapsmedError, match="t10k-images-idx3-ubyte.gz: holds the same images "
                       "as train-images-idx3-ubyte.gz"):
        preprocess_multimnist(raw, tmp_path / "mm.h5", MultiMnistConfig(val=10))
    assert not (tmp_path / "mm.h5").exists()
    with pytest.raises(CapsmedError, match="the test split would be the training images"):
        preprocess_mnist(raw, tmp_path / "m.h5", MnistConfig(val=10))
