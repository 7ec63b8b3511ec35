"""``capsmed analyze affine | routing | compactness``: the transforms' conventions, exact
numbers on synthetic models and representations, and the CLI on a tiny CapsNet run."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import DatasetWriter, load_split
from capsmed.evaluate.analyses.affine import (
    affine_linear,
    affine_robustness,
    inside_shifts,
    warp,
)
from capsmed.evaluate.analyses.compactness import (
    compactness_score,
    factor_transforms,
    representation_extractor,
    semantic_compactness,
)
from capsmed.evaluate.analyses.configs import AffineConfig, CompactnessConfig, expand_factors
from capsmed.evaluate.analyses.routing import sample_entropy
from capsmed.models.common import ModelOutput
from capsmed.runs.checkpoint import load_checkpoint
from capsmed.train.checkpoint import save_checkpoint
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train
from tests.helpers import TINY_CAPSNET, assert_clean_failure, scored_capsnet, two_label_run

runner = CliRunner()
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def caps_run(tiny_h5, tmp_path_factory):
    out = tmp_path_factory.mktemp("analyze") / "caps"
    return train(TrainConfig(data=str(tiny_h5), arch="capsnet", epochs=2, batch_size=8,
                             steps_per_epoch=2, patience=None, out=str(out),
                             model_kwargs=TINY_CAPSNET), disable_progress=True)


def _untrained_capsnet_run(run, data, class_names):
    """``run``: a tiny capsnet checkpoint (untrained) of ``data``'s 28 px grey images."""
    from capsmed.models import create_model

    kwargs = {"in_channels": 1, "num_classes": len(class_names), "input_size": [28, 28],
              **TINY_CAPSNET}
    run.mkdir()
    save_checkpoint(run, create_model("capsnet", **kwargs),
                    {"arch": "capsnet", "model_kwargs": kwargs, "epoch": 1,
                     "data": str(data), "class_names": list(class_names)})
    (run / "summary.json").write_text("{}")  # a finished run, as far as capsmed can tell
    return run


def _fresh_copy(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("analysis"))
    return copy




def _blobs(centres, sigmas, size=40):
    """uint8 Gaussian blobs [N, 1, size, size] at (x, y) pixel centres."""
    yy, xx = np.mgrid[0:size, 0:size].astype(float)
    out = [255 * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * s * s))
           for (cx, cy), s in zip(centres, sigmas, strict=True)]
    return np.round(np.stack(out)[:, None]).astype(np.uint8)


class MassModel(nn.Module):
    """Global sum pooling: invariant to rotation and flips of a centred blob."""

    loss_kind = "ce"

    def forward(self, x, target=None):
        m = x.sum(dim=(1, 2, 3))
        return ModelOutput(scores=torch.stack([28.0 - m, m - 28.0], 1))


class SideModel(nn.Module):
    """Class = which side of the vertical centre line holds the mass."""

    loss_kind = "ce"

    def forward(self, x, target=None):
        w = x.sum(1)
        xs = torch.arange(w.shape[-1], dtype=x.dtype) - (w.shape[-1] - 1) / 2
        cx = (w.sum(1) * xs).sum(-1) / w.sum((1, 2)).clamp_min(1e-6)
        return ModelOutput(scores=torch.stack([-cx, cx], 1))


# ------------------------------------------------------------------ affine


def test_warp_rotates_clockwise_and_translates_by_whole_pixels():
    x = torch.zeros(1, 1, 9, 9)
    x[0, 0, 4, 6] = 1.0  # two pixels right of the centre
    rot = torch.as_tensor(affine_linear(np.array([90.0]), np.zeros(1), np.ones(1), np.ones(1)))
    assert np.argwhere(warp(x, rot, torch.zeros(1, 2))[0, 0].numpy() > 0.5).tolist() == [[6, 4]]
    eye = torch.eye(2, dtype=torch.float64)[None]
    moved = warp(x, eye, torch.tensor([[1.0, -2.0]]))[0, 0].numpy()
    assert np.argwhere(moved > 0.5).tolist() == [[2, 7]] and moved.sum() == pytest.approx(1)
    wide = torch.zeros(1, 1, 8, 12)
    wide[0, 0, 3, 9] = 1.0
    assert np.argwhere(warp(wide, eye, torch.tensor([[-2.0, 3.0]]))[0, 0].numpy() > 0.5
                       ).tolist() == [[6, 7]]
    shear = torch.as_tensor(affine_linear(np.zeros(1), np.array([45.0]), np.ones(1),
                                          np.ones(1)))
    assert torch.allclose(shear[0], torch.tensor([[1.0, 1.0], [0.0, 1.0]], dtype=torch.float64))


def test_inside_shifts_keep_the_content_on_the_canvas():
    x = torch.zeros(3, 1, 20, 20)
    x[:, 0, 2:6, 2:6] = 1.0  # content in the top-left corner
    eye = torch.eye(2, dtype=torch.float64).expand(3, 2, 2)
    t = inside_shifts(x, eye, torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0]]),
                      torch.tensor([8.0, 8.0]))
    assert t.tolist() == [[-2.0, -2.0], [8.0, 8.0], [3.0, 3.0]]
    blobs = torch.as_tensor(_blobs([(12.0, 26.0)] * 64, [2.0] * 64)).float() / 255
    rng = np.random.default_rng(0)
    linear = torch.as_tensor(affine_linear(rng.uniform(-20, 20, 64), rng.uniform(-45, 45, 64),
                                           *rng.uniform(0.8, 1.2, (2, 64))))
    u = torch.as_tensor(rng.uniform(-1, 1, (64, 2)))
    limit = torch.tensor([8.0, 8.0])
    shifts = inside_shifts(blobs, linear, u, limit)
    assert shifts.abs().max() <= 8.0  # never beyond affNIST's range
    kept = warp(blobs, linear, shifts)
    free = warp(blobs, linear, u * limit)
    expected = blobs.sum((1, 2, 3)) * torch.linalg.det(linear).float()  # area scales by det
    assert torch.allclose(kept.sum((1, 2, 3)), expected, rtol=0.02)
    assert (free.sum((1, 2, 3)) < 0.9 * expected).any()  # free shifts push some out
    dot = torch.zeros(1, 1, 40, 40)
    dot[0, 0, 20, 2] = 1.0  # scaled by 1.2 about the centre it leaves the canvas by 1.5 px
    stretch = torch.tensor([[[1.2, 0.0], [0.0, 1.0]]], dtype=torch.float64)
    assert inside_shifts(dot, stretch, torch.zeros(1, 2), torch.tensor([1.0, 1.0])
                         ).tolist() == [[1.0, 0.0]]  # cannot fit within +-1: the closest


def test_rotation_invariant_model_keeps_its_accuracy_a_side_model_does_not():
    centred = _blobs([(19.5, 19.5)] * 8, [1.5, 3.0] * 4)
    labels = np.array([0, 1] * 4)
    cfg = AffineConfig(repeats=2, sweep_step=45, seed=3)
    inv = affine_robustness(MassModel(), centred, labels, CPU, cfg)
    assert inv.clean_accuracy == inv.affine_accuracy == 1.0
    assert inv.sweep_angles == [-180, -135, -90, -45, 0, 45, 90, 135, 180]
    assert inv.sweep_accuracy == [1.0] * 9
    assert inv.flips == {"hflip": {"accuracy": 1.0, "unchanged": 1.0},
                         "vflip": {"accuracy": 1.0, "unchanged": 1.0}}
    assert 0.3 < inv.mean_abs_translation_px < 8.0  # shifted, within the kept-inside range

    sided = _blobs([(11.5, 19.5), (27.5, 19.5)] * 4, [2.0] * 8)
    side = affine_robustness(SideModel(), sided, labels, CPU,
                             AffineConfig(sweep_step=90, translation=0.0))
    assert side.clean_accuracy == side.affine_accuracy == 1.0  # +-20 deg keeps the side
    assert dict(zip(side.sweep_angles, side.sweep_accuracy, strict=True))[0.0] == 1.0
    assert side.sweep_accuracy[0] == side.sweep_accuracy[-1] == 0.0  # +-180: sides swap
    assert side.flips == {"hflip": {"accuracy": 0.0, "unchanged": 0.0},
                          "vflip": {"accuracy": 1.0, "unchanged": 1.0}}


def _contract(path, images, labels, class_names):
    with DatasetWriter(path, dataset="toy", kind="folder", domain="generic",
                       class_names=class_names,
                       image_shape=images.shape[1:], preprocessing={}, source={}) as w:
        w.append("test", images, labels, np.array([f"g{i}" for i in range(len(labels))]))
    return path


def test_affine_cli_on_a_capsnet_run_with_an_affnist_file(caps_run, tiny_h5, tmp_path):
    test = load_split(tiny_h5, "test")
    affnist = _contract(tmp_path / "aff.h5", test.images[:, :, ::-1].copy(), test.labels,
                        ["non-mitosis", "mitosis"])
    result = runner.invoke(app, ["-q", "analyze", "affine", str(caps_run), "--affnist",
                                 str(affnist), "--sweep-step", "90", "--max-samples", "10"])
    assert result.exit_code == 0, result.output
    out = caps_run / "analysis" / "affine"
    record = json.loads((out / "affine.json").read_text())
    sweep = dict(zip(record["sweep_angles"], record["sweep_accuracy"], strict=True))
    assert record["samples"] == 10 and sweep[0.0] == record["clean_accuracy"]
    model, _ = load_checkpoint(caps_run)
    with torch.no_grad():
        pred = model(torch.from_numpy(test.images[:, :, ::-1].copy()).float() / 255)
    expected = float((pred.scores.argmax(1).numpy() == test.labels).mean())
    assert record["affnist"]["accuracy"] == pytest.approx(expected)
    assert record["affnist"]["samples"] == len(test)
    assert (out / "affine.csv").read_text().splitlines()[0] == "condition,accuracy,samples"
    assert len((out / "rotation_sweep.csv").read_text().splitlines()) == 1 + 5
    assert {"rotation_sweep.png", "examples.png"} <= {p.name for p in out.iterdir()}

    digits = _contract(tmp_path / "digits.h5", test.images, test.labels % 10,
                       [str(d) for d in range(10)])
    fresh = _fresh_copy(caps_run, tmp_path)
    bad = runner.invoke(app, ["-q", "analyze", "affine", str(fresh), "--affnist", str(digits),
                              "--sweep-step", "180", "--max-samples", "2"])
    assert_clean_failure(bad, "digits.h5: classes", fresh / "analysis")


# ------------------------------------------------------------------ routing


def test_coupling_entropy_is_log_j_for_uniform_and_zero_for_one_hot():
    uniform = torch.full((2, 5, 4), 0.25)
    one_hot = torch.nn.functional.one_hot(torch.arange(10) % 4, 4).float().view(2, 5, 4)
    assert sample_entropy(uniform).tolist() == pytest.approx([math.log(4)] * 2)
    assert sample_entropy(one_hot).tolist() == [0.0, 0.0]
    half = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]])
    assert sample_entropy(half).item() == pytest.approx(math.log(2) / 2)


def test_routing_cli_matches_the_logged_curve_and_the_couplings(caps_run, tiny_h5, tmp_path):
    result = runner.invoke(app, ["-q", "analyze", "routing", str(caps_run), str(caps_run),
                                 "--out", str(tmp_path / "both")])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "both" / "routing.json").read_text())
    assert len(record["runs"]) == 2
    run = record["runs"][0]
    logged = [json.loads(line) for line in (caps_run / "metrics.jsonl").read_text().splitlines()]
    assert [p["routing_entropy"] for p in run["curve"]] == [m["routing_entropy"] for m in logged]
    assert [p["val_acc"] for p in run["curve"]] == [m["val_acc"] for m in logged]
    model, _ = load_checkpoint(caps_run)
    test = load_split(tiny_h5, "test")
    with torch.no_grad():
        c = model(torch.from_numpy(test.images).float() / 255, return_couplings=True).couplings
    h = -(c * torch.log(c)).sum(-1)
    assert run["lower_capsules"] == c.shape[1] and run["upper_capsules"] == 2
    assert run["test_entropy"] == pytest.approx(h.mean().item(), rel=1e-5)
    assert run["test_normalised"] == pytest.approx(h.mean().item() / math.log(2), rel=1e-5)
    for k, name in enumerate(["non-mitosis", "mitosis"]):
        assert run["per_class"][name]["entropy"] == pytest.approx(
            h[torch.from_numpy(test.labels == k)].mean().item(), rel=1e-5)
    assert sum(v["samples"] for v in run["per_class"].values()) == len(test)
    assert len((tmp_path / "both" / "routing_epochs.csv").read_text().splitlines()) == 1 + 4
    assert (tmp_path / "both" / "routing_entropy_vs_accuracy.png").stat().st_size > 0


def test_routing_refuses_a_convnet(tiny_h5, tmp_path):
    from capsmed.models import create_model

    kwargs = {"in_channels": 1, "num_classes": 2, "input_size": [28, 28], "widths": [3, 4],
              "hidden": [8]}
    run = tmp_path / "lenet"
    run.mkdir()
    save_checkpoint(run, create_model("lenet", **kwargs),
                    {"arch": "lenet", "model_kwargs": kwargs, "epoch": 1, "data": str(tiny_h5),
                     "class_names": ["non-mitosis", "mitosis"]})
    (run / "summary.json").write_text("{}")  # finished: no warning beside the refusal
    result = runner.invoke(app, ["-q", "analyze", "routing", str(run)])
    assert_clean_failure(result, "'lenet' has no routing couplings", run / "analysis")


def test_routing_without_logged_entropy_analyses_the_checkpoint(tiny_h5, tmp_path):

    run = _untrained_capsnet_run(tmp_path / "old", tiny_h5, ["non-mitosis", "mitosis"])
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "train_loss": 0.5}) + "\n")
    result = runner.invoke(app, ["-q", "analyze", "routing", str(run)])
    assert result.exit_code == 0, result.output
    assert "no routing_entropy logged" in result.stderr
    out = run / "analysis" / "routing"
    record = json.loads((out / "routing.json").read_text())["runs"][0]
    assert record["curve"] == [] and 0 < record["test_normalised"] <= 1
    assert sorted(p.name for p in out.iterdir()) == [
        "routing.json", "routing_entropy_test.png", "routing_epochs.csv",
        "routing_iterations.csv", "routing_test.csv"]


def test_routing_into_a_used_folder_leaves_no_figure_of_the_earlier_runs(caps_run, tiny_h5,
                                                                         tmp_path):
    """Figures that only some calls draw (the epoch curves) must not survive from an
    earlier call into the same --out, where they would pass for the new runs'."""

    out = tmp_path / "figs"
    result = runner.invoke(app, ["-q", "analyze", "routing", str(caps_run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "routing_entropy_epochs.png").is_file()
    # no routing entropy logged: no curves to draw
    old = _untrained_capsnet_run(tmp_path / "old", tiny_h5, ["non-mitosis", "mitosis"])
    (old / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "train_loss": 0.5}) + "\n")
    result = runner.invoke(app, ["-q", "analyze", "routing", str(old), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert not (out / "routing_entropy_epochs.png").exists()
    assert not (out / "routing_entropy_vs_accuracy.png").exists()


def test_analyses_refuse_a_run_whose_dataset_file_changed(caps_run, tmp_path):
    """As capsmed evaluate does: the run's own data, by the digest config.yaml holds."""
    import yaml

    run = _fresh_copy(caps_run, tmp_path)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["dataset"]["digest"] = "sha256:" + "0" * 64
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    for analysis in ("routing", "affine"):
        result = runner.invoke(app, ["-q", "analyze", analysis, str(run)])
        assert_clean_failure(result, "the dataset file changed since", run / "analysis")


# ------------------------------------------------------------------ compactness


def test_compactness_score_is_log_d_for_one_unit_and_zero_for_all_alike():
    t = torch.linspace(-1, 1, 11)[:, None]
    one = torch.cat([t, torch.ones(11, 7)], dim=1)  # only unit 0 varies
    assert compactness_score(one).item() == pytest.approx(math.log(8), abs=1e-12)
    assert compactness_score(t.repeat(1, 8)).item() == pytest.approx(0.0, abs=1e-12)
    two = torch.cat([t, -3 * t / 3, torch.zeros(11, 2)], dim=1)  # 2 of 4 equally
    assert compactness_score(two).item() == pytest.approx(math.log(2), abs=1e-12)
    assert math.isnan(compactness_score(torch.ones(11, 8)).item())
    batch = torch.stack([one, t.repeat(1, 8)])
    assert compactness_score(batch).tolist() == pytest.approx([math.log(8), 0.0], abs=1e-12)


def test_factor_values_include_the_identity_and_scale_with_the_image():
    cfg = CompactnessConfig(steps=5)
    values, linear, shift = factor_transforms("translation-x", cfg, (28, 56))
    assert values.tolist() == [-8, -4, 0, 4, 8]
    assert shift[:, 0].tolist() == [-11.2, -5.6, 0.0, 5.6, 11.2] and not shift[:, 1].any()
    values, linear, _ = factor_transforms("shear-y", cfg, (40, 40))
    assert np.allclose(linear[0], [[1.0, 0.0], [-1.0, 1.0]])
    _, linear, _ = factor_transforms("scale", cfg, (40, 40))
    assert linear[2].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert expand_factors(["shear", "rotation", "shear-x"]) == ("shear-x", "shear-y", "rotation")


class CentroidCapsules(nn.Module):
    """Capsules [B, 2, 4] = (x-centroid, constants) or the x-centroid in every unit."""

    loss_kind = "margin"

    def __init__(self, spread: bool) -> None:
        super().__init__()
        self.spread = spread

    def forward(self, x, target=None):
        cx = SideModel()(x).scores[:, 1]
        caps = cx[:, None].repeat(1, 4) if self.spread else torch.stack(
            [cx, torch.ones_like(cx), torch.full_like(cx, 2.0), torch.zeros_like(cx)], 1)
        caps = torch.stack([caps, caps + 1], 1)
        return ModelOutput(scores=caps.norm(dim=-1), capsules=caps)


def test_semantic_compactness_on_designed_representations():
    images = _blobs([(15.5, 19.5), (23.5, 17.5)], [2.0, 2.5])
    labels = np.array([0, 1])
    cfg = CompactnessConfig(factors=("translation-x", "rotation"), steps=5)
    describe, one = semantic_compactness(CentroidCapsules(False), images, labels, CPU, cfg)
    assert describe == "class capsule of the true class"
    assert one["translation-x"]["score"] == pytest.approx(math.log(4), abs=1e-9)
    assert one["translation-x"]["samples"] == 2 and one["translation-x"]["dimensions"] == 4
    _, spread = semantic_compactness(CentroidCapsules(True), images, labels, CPU, cfg)
    assert spread["translation-x"]["score"] == pytest.approx(0.0, abs=1e-9)
    assert spread["rotation"]["score"] == pytest.approx(0.0, abs=1e-9)


def test_convnets_are_read_at_the_penultimate_layer():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 5), nn.ReLU(), nn.Linear(5, 3))

    class Net(nn.Module):
        loss_kind = "ce"

        def __init__(self):
            super().__init__()
            self.body = net

        def forward(self, x, target=None):
            return ModelOutput(scores=self.body(x))

    x = torch.rand(3, 1, 4, 4)
    describe, extract = representation_extractor(Net(), x[:1])
    assert describe == "penultimate layer (input of 'body.3')"
    assert torch.equal(extract(x, torch.zeros(3, dtype=torch.long)), net[:3](x))


def test_compactness_cli_on_a_capsnet_run(caps_run, tmp_path):
    result = runner.invoke(app, ["-q", "analyze", "compactness", str(caps_run), "--factor",
                                 "rotation", "--factor", "translation", "--steps", "3",
                                 "--max-samples", "4"])
    assert result.exit_code == 0, result.output
    record = json.loads((caps_run / "analysis" / "compactness" / "compactness.json").read_text())
    assert list(record["factors"]) == ["rotation", "translation-x", "translation-y"]
    for r in record["factors"].values():
        assert r["dimensions"] == TINY_CAPSNET["class_dim"] and r["samples"] == 4
        assert 0.0 <= r["score"] <= r["max_score"] == pytest.approx(math.log(8))
    fresh = _fresh_copy(caps_run, tmp_path)
    bad = runner.invoke(app, ["-q", "analyze", "compactness", str(fresh), "--factor", "spin"])
    assert_clean_failure(bad, "unknown factor(s) spin", fresh / "analysis")


def test_compactness_refuses_two_digit_images(tmp_path):
    """Paper 004 keeps the capsule of *the* ground-truth class; on a MultiMNIST file the
    score silently kept the first digit's capsule and ignored the second digit."""
    data = tmp_path / "two.h5"
    images = np.random.default_rng(0).integers(0, 256, (4, 1, 28, 28), dtype=np.uint8)
    with DatasetWriter(data, dataset="toy", kind="multimnist", domain="digits",
                       class_names=["a", "b", "c"], image_shape=(1, 28, 28),
                       preprocessing={}, source={}) as w:
        w.append("test", images, np.array([0, 1, 2, 0]), np.array([f"g{i}" for i in range(4)]),
                 meta={"label2": np.array([1, 2, 0, 2])})
    torch.manual_seed(0)
    run = _untrained_capsnet_run(tmp_path / "run", data, ["a", "b", "c"])
    result = runner.invoke(app, ["-q", "analyze", "compactness", str(run), "--factor",
                                 "rotation", "--steps", "3"])
    assert_clean_failure(result, "has two labels per image (label2)", run / "analysis")


def test_routing_table_fits_80_columns_with_run_names_whole(caps_run, tmp_path):
    """Issue 23: `analyze routing` split run names over four lines at 80 columns."""
    runs = [tmp_path / "study" / "runs" / f"tupac16-capsnet-full-seed{s}-{h}"
            for s, h in ((0, "057f80bb72f2"), (1, "cc26506c1c5b"))]
    for run in runs:
        shutil.copytree(caps_run, run)
    result = runner.invoke(app, ["-q", "analyze", "routing", *map(str, runs), "--out",
                                 str(tmp_path / "out")], terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80
    record = json.loads((tmp_path / "out" / "routing.json").read_text())
    rows = [line for line in lines if " capsnet " in line]
    for run, summary, row in zip(runs, record["runs"], rows, strict=True):
        assert f"{summary['test_entropy']:.4f}" in row.split()
        shown = row.split()[0]
        assert shown != str(run) and all(piece in str(run) for piece in shown.split("…"))
        assert run.name.split("-", 3)[-1] in shown, row  # seed and digest kept
    classes = [line.split() for line in lines if line.split()[1:2] in (["non-mitosis"],
                                                                        ["mitosis"])]
    assert len(classes) == 4
    for (shown, *_), run in zip(classes, [runs[0], runs[0], runs[1], runs[1]], strict=True):
        assert all(piece in str(run) for piece in shown.split("…")), shown
        assert run.name.split("-", 3)[-1] in shown


def test_routing_reruns_the_checkpoint_with_other_iteration_counts(caps_run):
    """Whether the agreement steps matter: the kept checkpoint with 1 (uniform
    couplings), 2, 3 (trained) and 5 iterations; the model is left as trained."""
    import math

    from capsmed.evaluate.analyses.routing import routed_layers, routing_entropy

    result = routing_entropy(caps_run, device="cpu")
    rows = {r["iterations"]: r for r in result.by_iterations}
    assert sorted(rows) == [1, 2, 3, 5] and [r["trained"] for r in rows.values()] == \
        [False, False, True, False]
    assert rows[3]["agreement"] == 1.0 and 0.0 <= rows[1]["agreement"] <= 1.0
    # one iteration spreads every lower capsule uniformly: entropy log J, normalised 1
    assert rows[1]["normalised"] == pytest.approx(1.0, abs=1e-6)
    assert rows[1]["entropy"] == pytest.approx(math.log(result.upper_capsules), abs=1e-5)
    assert rows[3]["entropy"] == pytest.approx(result.test_entropy, abs=1e-6)
    model, _ = load_checkpoint(caps_run)
    assert [getattr(m, name) for m, name in routed_layers(model)] == [3]


def test_routing_reruns_change_every_routing_of_the_model(monkeypatch):
    """em-capsnet's EM layers were not found (no rows, and no word), and parallel-dr
    with 4 capsule layers kept its per-branch routing at the trained 3 iterations in
    the rows for 1, 2 and 5."""
    import capsmed.models.parallel as parallel
    from capsmed.evaluate.analyses.routing import iteration_sweep, routed_layers
    from capsmed.models import create_model
    from tests.helpers import TINY

    torch.manual_seed(0)
    images = np.random.default_rng(0).integers(0, 256, (4, 1, 28, 28), dtype=np.uint8)
    labels = np.arange(4) % 3
    base = {"in_channels": 1, "num_classes": 3, "input_size": [28, 28]}
    em = create_model("em-capsnet", **base, **TINY["em-capsnet"]).eval()
    rows = {r["iterations"]: r for r in iteration_sweep(em, images, labels, CPU, 4)}
    assert sorted(rows) == [1, 2, 3, 5] and rows[3]["trained"]
    assert rows[1]["normalised"] == pytest.approx(1.0, abs=1e-6)  # EM's uniform start
    assert {getattr(m, name) for m, name in routed_layers(em)} == {3}

    seen = []
    inner = parallel.dynamic_routing
    monkeypatch.setattr(parallel, "dynamic_routing",
                        lambda votes, iterations, *a, **k: seen.append(iterations)
                        or inner(votes, iterations, *a, **k))
    dr = create_model("parallel-dr", **base, **TINY["parallel-dr"], capsule_layers=4).eval()
    iteration_sweep(dr, images, labels, CPU, 4)
    assert sorted(set(seen)) == [1, 2, 3, 5]  # 2 forward passes per count
    assert dr.routing_iters == 3 and dr.classes.iterations == 3


def test_routing_on_two_digit_images_scores_both_digits(tmp_path):
    """On a MultiMNIST-like file the rerun's accuracy is the two-digit accuracy (both
    digits in the top two, as analyze multimnist): the first digit alone being the top
    class once counted as right."""
    from capsmed.evaluate.analyses.routing import routing_entropy

    model, kwargs, images, order = scored_capsnet(6)
    # the first digit is the top class everywhere; the second is the runner-up on the
    # first two images only, elsewhere the last class: two-digit accuracy 2/6
    first = order[:, 0]
    second = np.where(np.arange(6) < 2, order[:, 1], order[:, 2])
    data, run = two_label_run(tmp_path, model, kwargs, images, first, second)
    (run / "metrics.jsonl").write_text("")
    result = routing_entropy(run, device="cpu")
    trained = next(r for r in result.by_iterations if r["trained"])
    assert result.two_label and trained["accuracy"] == pytest.approx(2 / 6)
    assert trained["agreement"] == 1.0
    # by true class, an image counts for both its digits: grouped by the first digit
    # alone, a class drawn only as a second digit was missing from the table
    with torch.no_grad():
        c = model(torch.from_numpy(images).float() / 255, return_couplings=True).couplings
    h = (-(c * torch.log(c)).sum(-1)).mean(-1).numpy()
    for k, name in enumerate(["a", "b", "c"]):
        holds = (first == k) | (second == k)
        if holds.any():
            assert result.per_class[name]["samples"] == holds.sum()
            assert result.per_class[name]["entropy"] == pytest.approx(h[holds].mean(), rel=1e-5)
    assert sum(v["samples"] for v in result.per_class.values()) == 12


def test_affine_scores_a_cross_validation_runs_held_out_fold(tmp_path):
    """A fold run's file has no 'test' split (its test is the held-out rows of 'all'):
    the two-label check looked for one and stopped with 'the file is damaged'."""

    data = tmp_path / "cv.h5"
    images = np.random.default_rng(0).integers(0, 256, (6, 1, 28, 28), dtype=np.uint8)
    with DatasetWriter(data, dataset="toy", kind="folder", domain="generic",
                       class_names=["a", "b"], image_shape=(1, 28, 28), preprocessing={},
                       source={}) as w:
        w.append("all", images, np.array([0, 1] * 3), np.array([f"g{i}" for i in range(6)]),
                 folds=np.arange(6) % 2)
    torch.manual_seed(0)
    run = _untrained_capsnet_run(tmp_path / "run", data, ["a", "b"])
    np.save(run / "test_indices.npy", np.array([0, 1, 2]))
    np.save(run / "train_indices.npy", np.array([3, 4, 5]))
    result = runner.invoke(app, ["-q", "analyze", "affine", str(run), "--sweep-step", "180"])
    assert result.exit_code == 0, result.output
    record = json.loads((run / "analysis" / "affine" / "affine.json").read_text())
    assert record["samples"] == 3


def test_analyses_of_an_unfinished_run_say_so(tiny_h5, tmp_path, caplog):
    """As capsmed evaluate: the checkpoint of a run still training is of an intermediate
    epoch, which the analyses used without a word."""
    from capsmed.train.loop import TrainingInterrupted

    with pytest.raises(TrainingInterrupted):
        train(TrainConfig(data=str(tiny_h5), arch="capsnet", epochs=3, batch_size=8,
                          steps_per_epoch=1, patience=None, out=str(tmp_path / "run"),
                          model_kwargs=TINY_CAPSNET),
              disable_progress=True, stop_after_steps=2)
    result = runner.invoke(app, ["analyze", "compactness", str(tmp_path / "run"),
                                 "--factor", "rotation", "--steps", "2", "--max-samples", "2"])
    assert result.exit_code == 0, result.output
    assert "its training has not finished" in " ".join(result.stderr.split())


@pytest.mark.parametrize("command, args", [
    ("affine", ["--seed", "-1"]), ("compactness", ["--seed", "-1"]),
    ("manifold", ["--seed", "-1"]), ("manifold", ["--perplexity", "nan"])])
def test_a_negative_seed_or_nan_perplexity_is_refused_by_the_cli(tmp_path, command, args):
    """These failed with a NumPy (seed) or scikit-learn (perplexity) traceback after the
    run and its data were loaded; now the option is refused first, by name."""
    result = runner.invoke(app, ["-q", "analyze", command, str(tmp_path / "run"), *args])
    assert_clean_failure(result, f"{args[0][2:]} must be")


@pytest.mark.parametrize("second, refusal", [
    # image 0: 0 twice
    ([0, 2, 0, 1], "1 image(s) whose two labels (labels, meta/label2) are the same class"),
    ([1, 3, 0, 1], "'test/meta/label2' must hold one label within 0..2"),
])
def test_two_digit_analyses_refuse_second_labels_they_cannot_score(tmp_path, second,
                                                                   refusal):
    """Routing's rerun counted an image labelled with one class twice (or with a class
    the model lacks) wrong whatever it predicted, and analyze multimnist dropped the
    out-of-range digit from its table: both refuse such files, as evaluate does."""
    model, kwargs, images, _ = scored_capsnet(4)
    _, run = two_label_run(tmp_path, model, kwargs, images, np.array([0, 1, 2, 2]),
                           np.array(second))
    (run / "summary.json").write_text("{}")  # a finished run, as far as capsmed can tell
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "routing_entropy": 1.0}) + "\n")
    for analysis in ("routing", "multimnist"):
        result = runner.invoke(app, ["-q", "analyze", analysis, str(run)])
        assert_clean_failure(result, refusal, run / "analysis" / analysis)


def test_transfer_layers_given_empty_is_refused_not_derived(tmp_path):
    """--layers "" (a shell variable left empty) ran the derived layers, as if the option
    had not been given; "," was refused already."""
    for typed in ("", ","):
        result = runner.invoke(app, ["-q", "analyze", "transfer", "--a", str(tmp_path / "a.h5"),
                                     "--b", str(tmp_path / "b.h5"), "-o", str(tmp_path / "t"),
                                     "--arch", "lenet", "--layers", typed])
        assert_clean_failure(result, "--layers is empty")
    assert not (tmp_path / "t").exists()
