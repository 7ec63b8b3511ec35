"""``capsmed analyze manifold``: the translation grid, the Chamfer distance on hand-made
point sets, and the pipeline end to end on tiny checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import DatasetWriter, SplitData, load_split
from capsmed.errors import CapsmedError
from capsmed.evaluate.analyses.manifold import (
    align_to_grid,
    centre_on_mass,
    chamfer_distance,
    choose_pairs,
    grid_offsets,
    manifold_distances,
    normalise_points,
    representations,
    shift_image,
    single_digits,
    translation_grid,
)
from capsmed.models import create_model
from capsmed.train.checkpoint import save_checkpoint
from tests.helpers import TINY_CAPSNET

runner = CliRunner()


def _checkpoint(run, arch, data, **options):
    """A run directory holding an untrained model: the analysis needs no training."""
    torch.manual_seed(0)
    kwargs = {"in_channels": 1, "num_classes": 2, "input_size": [28, 28], **options}
    run.mkdir()
    save_checkpoint(run, create_model(arch, **kwargs),
                    {"arch": arch, "model_kwargs": kwargs, "epoch": 1, "data": str(data),
                     "class_names": ["non-mitosis", "mitosis"]})
    return run


def test_chamfer_distance_on_hand_made_point_sets():
    grid = grid_offsets(1).astype(float)  # 3x3, spacing 1
    assert chamfer_distance(grid, grid) == 0.0
    assert chamfer_distance(grid, grid + [0.5, 0.0]) == pytest.approx(0.5)
    # one extra point far away: 0 one way, (0 + 5) / 2 the other way; halved
    assert chamfer_distance([[0, 0]], [[0, 0], [3, 4]]) == pytest.approx(1.25)
    assert chamfer_distance([[0, 0], [3, 4]], [[0, 0]]) == pytest.approx(1.25)


def test_normalisation_and_procrustes_undo_scale_rotation_reflection_and_shift():
    grid = grid_offsets(4).astype(float)
    norm = normalise_points(grid)
    assert np.allclose(norm.mean(0), 0) and np.sqrt((norm ** 2).sum(1).mean()) == pytest.approx(1)
    a = np.radians(30)
    rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]) @ np.diag([1, -1])
    embedding = 7.0 * grid @ rot.T + [100.0, -3.0]
    scores = manifold_distances(embedding, grid)
    assert scores["chamfer"] == pytest.approx(0, abs=1e-9)
    assert scores["aligned_error"] == pytest.approx(0, abs=1e-9)
    # Chamfer compares sets: a scrambled lattice matches it, the aligned error does not
    scrambled = grid[np.random.default_rng(0).permutation(len(grid))]
    assert chamfer_distance(normalise_points(scrambled), norm) == pytest.approx(0, abs=1e-12)
    assert manifold_distances(scrambled, grid)["aligned_error"] > 0.5
    aligned, target = align_to_grid(embedding, grid)
    assert np.allclose(aligned, target)


def test_translation_grid_moves_one_digit_over_the_other():
    fixed = np.zeros((1, 12, 12), np.uint8)
    fixed[0, 5:7, 5:7] = 200
    moving = np.zeros((1, 12, 12), np.uint8)
    moving[0, 6, 6] = 100
    images, offsets = translation_grid(fixed, moving, radius=2, step=2)
    assert images.shape == (25, 1, 12, 12) and offsets[0].tolist() == [-2, -2]
    assert offsets.tolist().index([0, 0]) == 12
    assert images[12, 0, 6, 6] == 255  # overlaid and clipped: min(200 + 100, 255)
    i = offsets.tolist().index([-1, 2])
    assert images[i, 0, 4, 10] == 100 and images[i, 0, 6, 6] == 200
    assert shift_image(moving, 6, 0).sum() == 0  # pushed off the canvas: nothing wraps
    assert images.dtype == np.uint8


def test_multimnist_first_digits_are_moved_back_to_the_centre():
    centred = np.zeros((2, 1, 10, 10), np.uint8)
    centred[:, 0, 4:6, 4:6] = 255
    shifts = np.array([[2, -1], [-3, 3]], np.int8)
    shifted = np.stack([shift_image(im, int(dy), int(dx)) for im, (dy, dx) in
                        zip(centred, shifts, strict=True)])
    samples = SplitData(shifted + 1, np.array([0, 1]), np.array(["a", "b"]),
                        meta={"image_a": shifted, "shift_a": shifts})
    assert np.array_equal(single_digits(samples), centred)
    plain = SplitData(shifted, np.array([0, 1]), np.array(["a", "b"]))
    assert single_digits(plain) is shifted
    # first digits stored without their channel axis were moved as rows of pixels
    flat = SplitData(shifted, np.array([0, 1]), np.array(["a", "b"]),
                     meta={"image_a": shifted[:, 0], "shift_a": shifts})
    with pytest.raises(CapsmedError, match=r"meta/image_a must be uint8 \[2, 1, 10, 10\]"):
        single_digits(flat, "f.h5")


def test_centring_puts_the_centre_of_mass_in_the_middle():
    image = np.zeros((1, 11, 11), np.uint8)
    image[0, 1:3, 7:10] = 50  # centre of mass at row 1.5, col 8
    centred = centre_on_mass(image)
    assert centred.sum() == image.sum()
    rows, cols = np.nonzero(centred[0])
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (5, 6, 4, 6)  # shift (+4, -3)
    assert centre_on_mass(np.zeros((1, 5, 5), np.uint8)).sum() == 0


def test_pairs_are_of_two_classes_and_distinct_while_possible():
    labels = np.array([0, 1, 2, 0, 1, 2, 2])
    pairs = choose_pairs(labels, 6, seed=1)
    classes = [(labels[a], labels[b]) for a, b in pairs]
    assert all(a != b for a, b in classes) and len(set(classes)) == 6
    assert choose_pairs(labels, 6, seed=1) == pairs
    with pytest.raises(Exception, match="at least two classes"):
        choose_pairs(np.zeros(4, int), 1, 0)


def test_convnets_embed_their_first_fully_connected_layer(tiny_h5):
    torch.manual_seed(0)
    model = create_model("lenet", widths=[3, 4], hidden=[8]).eval()
    images = load_split(tiny_h5, "test").images[:5]
    describe, feats = representations(model, images, torch.device("cpu"))
    assert describe == "output of 'classifier.1'" and feats.shape == (5, 8)
    with torch.no_grad():
        x = torch.from_numpy(images).float() / 255
        expected = model.classifier[1](model.classifier[0](model.features(x)))
    assert np.allclose(feats, expected.numpy(), atol=1e-6)
    _, conv = representations(model, images, torch.device("cpu"), layer="features.3")
    assert conv.shape == (5, 4 * 10 * 10)


def test_manifold_cli_end_to_end(tiny_h5, tmp_path):
    run = _checkpoint(tmp_path / "caps", "capsnet", tiny_h5, **TINY_CAPSNET)
    result = runner.invoke(app, ["-q", "analyze", "manifold", str(run), "--pairs", "2",
                                 "--radius", "2"])
    assert result.exit_code == 0, result.output
    out = run / "analysis" / "manifold"
    record = json.loads((out / "manifold.json").read_text())
    assert record["grid_points"] == 25 and len(record["pairs"]) == 2
    assert record["representation"] == "class capsules (after the first routing)"
    chamfer = [p["chamfer"] for p in record["pairs"]]
    assert record["chamfer_mean"] == pytest.approx(np.mean(chamfer))
    assert record["chamfer_variance"] == pytest.approx(np.var(chamfer))
    assert all(0 < c < 2 for c in chamfer)  # normalised sets: radius-1 clouds
    assert {p["fixed_class"] for p in record["pairs"]} == {"non-mitosis", "mitosis"}
    assert len((out / "manifold.csv").read_text().splitlines()) == 3
    assert {"manifold.png", "manifold_inputs.png"} <= {p.name for p in out.iterdir()}

    again = runner.invoke(app, ["-q", "analyze", "manifold", str(run), "--pairs", "2",
                                "--radius", "2"])
    assert again.exit_code == 0
    assert json.loads((out / "manifold.json").read_text()) == record  # seeded

    bad = runner.invoke(app, ["-q", "analyze", "manifold", str(run), "--radius", "2",
                              "--layer", "nope"])
    assert bad.exit_code == 1 and "has no layer 'nope'" in bad.stderr


@pytest.mark.parametrize("arch, size, kwargs, where", [
    ("capsnet", 28, {}, "after the first routing"),
    ("convnet-r", 28, {"conv_channels": 8, "decoder_hidden": [8, 8]},
     "no routing: the grouped class activations"),
    ("parallel-em", 64, {"branches": 2},
     "after the last routing, not paper 003's Cap1 after the first")])
def test_the_capsule_representation_says_which_routing_it_follows(arch, size, kwargs, where):
    """Paper 003's Cap1 is the layer after the first routing; with more routed layers the
    class capsules come later, and the label must not claim otherwise."""
    from capsmed.evaluate.analyses.manifold import representations
    from capsmed.models import create_model

    channels = 1 if size == 28 else 3
    model = create_model(arch, in_channels=channels, num_classes=2, input_size=[size, size],
                         **kwargs)
    images = np.zeros((2, channels, size, size), np.uint8)
    label, features = representations(model, images, torch.device("cpu"))
    assert label == f"class capsules ({where})" and len(features) == 2


def _two_digit_file(path, split, folds=None, sources=True):
    """Six hand-made two-digit samples of two classes (28x28), first digits stored."""
    rng = np.random.default_rng(1)
    image_a = rng.integers(0, 120, (6, 1, 28, 28), dtype=np.uint8)
    image_b = rng.integers(0, 120, (6, 1, 28, 28), dtype=np.uint8)
    meta = {"label2": np.array([1, 0, 1, 0, 1, 0])}
    if sources:
        meta |= {"image_a": image_a, "shift_a": np.zeros((6, 2), np.int64)}
    from capsmed.data.contract import DatasetWriter

    with DatasetWriter(path, dataset="toy", kind="multimnist", domain="digits",
                       class_names=["non-mitosis", "mitosis"],
                       image_shape=(1, 28, 28), preprocessing={}, source={}) as w:
        w.append(split, image_a + image_b, np.array([0, 1, 0, 1, 0, 1]),
                 np.array([f"g{i}" for i in range(6)]), meta=meta, folds=folds)
    return path, image_a


def test_two_digit_images_without_their_sources_are_refused(tmp_path):
    """preprocess multimnist --no-store-sources keeps no single digits: the overlaid
    pairs were taken as the 'single' digits, so four digits were overlaid."""
    data, _ = _two_digit_file(tmp_path / "two.h5", "test", sources=False)
    run = _checkpoint(tmp_path / "caps", "capsnet", data, **TINY_CAPSNET)
    result = runner.invoke(app, ["-q", "analyze", "manifold", str(run), "--pairs", "1",
                                 "--radius", "1"])
    assert result.exit_code == 1 and "not their sources" in result.stderr
    assert not (run / "analysis").exists()


def test_a_cross_validation_runs_held_out_rows_keep_their_meta(tmp_path):
    """A fold run's test rows come with their meta (MultiMNIST's first digits and
    second labels); they were dropped, and the manifold test overlaid two-digit images."""
    from capsmed.evaluate.analyses.common import load_samples
    from capsmed.runs import open_run

    data, image_a = _two_digit_file(tmp_path / "cv.h5", "all", folds=np.arange(6) % 2)
    run = _checkpoint(tmp_path / "caps", "capsnet", data, **TINY_CAPSNET)
    np.save(run / "test_indices.npy", np.array([0, 2, 4]))
    np.save(run / "train_indices.npy", np.array([1, 3, 5]))
    samples = load_samples(open_run(run, device="cpu"), "test", with_meta=True)
    assert samples.labels.tolist() == [0, 0, 0]
    assert samples.meta["label2"].tolist() == [1, 1, 1]
    np.testing.assert_array_equal(single_digits(samples), image_a[[0, 2, 4]])


@pytest.mark.parametrize("radius, step", [(7, 4), (10, 4)])
def test_offsets_that_move_the_digit_off_the_image_are_refused(tiny_h5, tmp_path, radius,
                                                               step):
    """At 28 px the moving digit left the canvas whole (a grid of the fixed digit alone,
    scored without a word), and beyond it the shift failed with a traceback."""
    run = _checkpoint(tmp_path / "caps", "capsnet", tiny_h5, **TINY_CAPSNET)
    result = runner.invoke(app, ["-q", "analyze", "manifold", str(run), "--pairs", "1",
                                 "--radius", str(radius), "--step", str(step)])
    assert result.exit_code == 1 and "off the 28 px image" in result.stderr
    assert not (run / "analysis").exists()


def test_a_cross_validation_runs_pairs_name_rows_of_its_file(tmp_path):
    """A fold run's digits are its held-out rows of split 'all': the indices recorded
    were positions among those rows (0-2 here), which name other images of the file."""
    data = tmp_path / "cv.h5"
    images = np.random.default_rng(0).integers(0, 256, (8, 1, 28, 28), dtype=np.uint8)
    with DatasetWriter(data, dataset="toy", kind="folder", domain="generic",
                       class_names=["non-mitosis", "mitosis"], image_shape=(1, 28, 28),
                       preprocessing={}, source={}) as w:
        w.append("all", images, np.array([0, 1] * 4), np.array([f"g{i}" for i in range(8)]),
                 folds=np.arange(8) % 2)
    run = _checkpoint(tmp_path / "caps", "capsnet", data, **TINY_CAPSNET)
    (run / "summary.json").write_text("{}")
    held_out = np.array([5, 6, 7])
    np.save(run / "test_indices.npy", held_out)
    np.save(run / "train_indices.npy", np.arange(5))
    result = runner.invoke(app, ["-q", "analyze", "manifold", str(run), "--pairs", "2",
                                 "--radius", "1", "--perplexity", "2"])
    assert result.exit_code == 0, result.output
    record = json.loads((run / "analysis" / "manifold" / "manifold.json").read_text())
    labels = load_split(data, "all").labels
    for pair in record["pairs"]:
        for end in ("fixed", "moving"):
            assert pair[f"{end}_index"] in held_out
            assert ["non-mitosis", "mitosis"][labels[pair[f"{end}_index"]]] == \
                pair[f"{end}_class"]
    assert record["indices_of_split"] == "all"
