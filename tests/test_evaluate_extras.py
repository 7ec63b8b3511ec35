"""Evaluation extras: orientation agreement, capsule grids, report.html, --data."""

from __future__ import annotations

import base64
import json
import logging
import re
import shutil

import numpy as np
import pytest
import torch
import yaml
from matplotlib.image import imread
from sklearn.metrics import roc_auc_score
from torch import nn
from typer.testing import CliRunner

import capsmed
from capsmed.cli import app
from capsmed.data.contract import DatasetWriter, load_split, read_info
from capsmed.errors import CapsmedError
from capsmed.evaluate.agreement import (
    ORIENTATIONS,
    all_orientations,
    orientation_agreement,
    orientation_predictions,
)
from capsmed.evaluate.capsule_grids import perturb_dimensions
from capsmed.evaluate.evaluation import evaluate_run
from capsmed.models.capsules import MaskedDecoder
from capsmed.runs.checkpoint import load_checkpoint
from capsmed.runs.scores import predict_scores
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train
from tests.helpers import TINY, TINY_CAPSNET, assert_clean_failure, folder_lenet

runner = CliRunner()
CPU = torch.device("cpu")


class GlobalMean(nn.Module):
    """Class 1 when the mean intensity is above 0.5: exactly invariant to rotations/flips."""

    def forward(self, x):
        m = x.mean(dim=(1, 2, 3))
        return type("Out", (), {"scores": torch.stack([0.5 - m, m - 0.5], dim=1)})()


class TopLeftPixel(nn.Module):
    """Class 1 when the top-left pixel is bright: not invariant."""

    def forward(self, x):
        p = x[:, 0, 0, 0]
        return type("Out", (), {"scores": torch.stack([0.5 - p, p - 0.5], dim=1)})()


def test_all_orientations_are_the_eight_symmetries_of_the_square():
    x = torch.arange(9.0).view(1, 1, 3, 3)
    views = all_orientations(x)
    assert views.shape == (8, 1, 1, 3, 3)
    assert len({tuple(v.flatten().tolist()) for v in views}) == 8
    assert torch.equal(views[ORIENTATIONS.index("identity")], x)
    assert torch.equal(views[ORIENTATIONS.index("flip+rot90")], x.transpose(-2, -1))
    # a flip up-down (paper 001) is one of them: left-right flip + 180 degrees
    assert torch.equal(views[ORIENTATIONS.index("flip+rot180")], torch.flip(x, dims=(-2,)))


def test_agreement_of_an_exactly_invariant_model_is_one():
    rng = np.random.default_rng(0)
    dark = rng.integers(0, 100, (3, 1, 5, 5))
    bright = rng.integers(155, 256, (3, 1, 5, 5))
    images = np.concatenate([dark, bright]).astype(np.uint8)
    labels = np.array([0, 0, 0, 1, 1, 0])  # the last bright image is labelled wrongly
    result = orientation_agreement(GlobalMean(), images, labels, CPU, batch_size=16)
    assert result.agreement == 1.0  # same class everywhere, right or wrong
    assert result.accuracy == {name: pytest.approx(5 / 6) for name in ORIENTATIONS}
    assert result.samples == 6


@pytest.mark.parametrize("batch_size", [8, 512])  # one image per pass, or all at once
def test_agreement_of_a_corner_reading_model(batch_size):
    images = np.zeros((4, 1, 4, 4), np.uint8)
    images[1] = 255                   # all bright: class 1 in every orientation
    images[2, 0, 0, 0] = 255          # only the top-left corner: class 1 in 2 of 8
    images[3, 0, [0, 0, 3, 3], [0, 3, 0, 3]] = 255  # every corner: class 1 everywhere
    labels = np.array([0, 1, 1, 1])
    preds = orientation_predictions(TopLeftPixel(), images, CPU, batch_size)
    # the top-left pixel stays put under the identity and the transpose only
    assert preds[:, 2].tolist() == [1, 0, 0, 0, 0, 1, 0, 0]
    result = orientation_agreement(TopLeftPixel(), images, labels, CPU, batch_size)
    assert result.agreement == 0.75
    assert result.accuracy["identity"] == result.accuracy["flip+rot90"] == 1.0
    assert [result.accuracy[n] for n in ("rot90", "rot180", "rot270", "flip", "flip+rot180",
                                         "flip+rot270")] == [0.75] * 6
    assert result.mean_accuracy == pytest.approx((2 * 1.0 + 6 * 0.75) / 8)


def test_agreement_refuses_non_square_images():
    with pytest.raises(ValueError, match="square images, got 4x6"):
        orientation_predictions(GlobalMean(), np.zeros((2, 1, 4, 6), np.uint8), CPU)


def test_perturbation_shifts_one_dimension_of_one_capsule():
    torch.manual_seed(0)
    decoder = MaskedDecoder(3, 4, (1, 6, 6), (8,)).eval()
    capsules = torch.rand(3, 4)
    shifts = np.linspace(-0.25, 0.25, 11)
    grid = perturb_dimensions(decoder, capsules, 1, shifts)
    assert grid.shape == (4, 11, 1, 6, 6)
    with torch.no_grad():
        plain = decoder(capsules[None], torch.tensor([1]))[0].numpy()
        moved = capsules.clone()
        moved[1, 2] -= 0.25
        expected = decoder(moved[None], torch.tensor([1]))[0].numpy()
    for d in range(4):  # shift 0 is the plain reconstruction in every row
        np.testing.assert_allclose(grid[d, 5], plain, atol=1e-6)
    np.testing.assert_allclose(grid[2, 0], expected, atol=1e-6)
    assert np.abs(grid[2, 0] - plain).max() > 1e-4  # the shift does change the picture


@pytest.fixture(scope="module")
def capsnet_run(tiny_h5, tmp_path_factory):
    out = tmp_path_factory.mktemp("caps") / "run"
    return train(TrainConfig(data=str(tiny_h5), arch="capsnet", epochs=1, batch_size=16,
                             seed=2, model_kwargs=dict(TINY_CAPSNET), out=str(out)),
                 disable_progress=True)


@pytest.fixture(scope="module")
def lenet_run(tiny_h5, tmp_path_factory):
    out = tmp_path_factory.mktemp("lenet") / "run"
    return train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                             seed=2, out=str(out)), disable_progress=True)


def _raw_scores(run, data):
    model, _ = load_checkpoint(run)
    split = load_split(data, "test")
    return predict_scores(model, split.images, CPU), split.labels


def test_capsnet_run_gets_grids_agreement_and_a_self_contained_html(capsnet_run, tiny_h5):
    result = evaluate_run(capsnet_run, agreement=True, disable_progress=True)
    report_dir = capsnet_run / "report"
    names = ("reconstructions.png", "perturbation-00-non-mitosis.png",
             "perturbation-01-mitosis.png", "confusion_matrix.png", "report.html")
    for name in names:
        assert name in result.files and (report_dir / name).stat().st_size > 1000, name
    pert = imread(report_dir / "perturbation-01-mitosis.png")
    assert pert.shape[1] > pert.shape[0] * 0.9  # 11 shifts wide, 8 dimensions tall

    report = json.loads((report_dir / "report.json").read_text())
    assert report["auc_scores"] == "class capsule lengths / activations, unnormalised"
    scores, labels = _raw_scores(capsnet_run, tiny_h5)
    for k, name in enumerate(report["class_names"]):
        assert report["per_class"][name]["auc"] == pytest.approx(
            roc_auc_score(labels == k, scores[:, k]))
    assert report["auc"] == report["per_class"]["mitosis"]["auc"]
    agr = report["agreement"]
    assert list(agr["accuracy_by_orientation"]) == list(ORIENTATIONS)
    assert 0.0 <= agr["agreement"] <= 1.0 and agr["samples"] == len(labels)
    # identity = the ordinary pass (other batch sizes may move a near-tie by one sample)
    assert abs(agr["accuracy_by_orientation"]["identity"] - report["accuracy"]) <= 1 / len(labels)
    assert "| flip+rot270 |" in (report_dir / "report.md").read_text()

    page = (report_dir / "report.html").read_text()
    for text in ("Total (macro)", "mitosis", "Agreement (Agr", "Accuracy by orientation",
                 "Reconstructions", "Capsule dimension perturbations", "Training curves"):
        assert text in page, text
    uris = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(uris) == 5  # confusion, curves, reconstructions, 2 perturbation grids
    assert base64.b64decode(uris[0]) == (report_dir / "confusion_matrix.png").read_bytes()
    assert base64.b64decode(uris[1]) == (capsnet_run / "curves.png").read_bytes()
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing fetched from outside
    assert "<script" not in page and "<link" not in page

    again = evaluate_run(capsnet_run, grids=False, disable_progress=True)
    assert not [n for n in again.files if n.startswith(("perturbation", "reconstructions"))]
    assert "agreement" not in json.loads((report_dir / "report.json").read_text())


def test_convnet_auc_uses_softmax_and_grids_are_skipped(lenet_run, tiny_h5, caplog):
    with caplog.at_level(logging.INFO, logger="capsmed"):
        result = evaluate_run(lenet_run, disable_progress=True)
    assert "grids skipped" in caplog.text
    assert "reconstructions.png" not in result.files and result.agreement is None
    report = json.loads((lenet_run / "report" / "report.json").read_text())
    assert report["auc_scores"] == "softmax of the logits" and "agreement" not in report
    logits, labels = _raw_scores(lenet_run, tiny_h5)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    assert report["auc"] == pytest.approx(roc_auc_score(labels == 1, p[:, 1]))
    page = (lenet_run / "report" / "report.html").read_text()
    assert "Reconstructions" not in page and "Agreement" not in page
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 2
    # the page says how the run was trained, with which capsmed, and which AUC it gives
    config = yaml.safe_load((lenet_run / "config.yaml").read_text())
    assert "<h2>Training settings</h2>" in page
    for key in ("arch", "epochs", "batch_size", "seed"):
        assert f"<th>{key}</th><td>{config['train'][key]}</td>" in page
    assert f"<th>trained with capsmed</th><td>{config['environment']['capsmed']}</td>" in page
    assert f"written by capsmed {capsmed.__version__} evaluate" in page
    assert "ROC AUC of the positive class" in page


def test_cli_agreement_flag_and_bad_batch_size(lenet_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(lenet_run, run, ignore=shutil.ignore_patterns("report"))
    result = runner.invoke(app, ["-q", "evaluate", str(run), "--batch-size", "0"])
    assert_clean_failure(result, "batch size must be >= 1", run / "report")
    result = runner.invoke(app, ["-q", "evaluate", str(run), "--agreement", "--batch-size", "8"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output + result.stderr
    assert "Agr " in result.output and "accuracy by orientation: identity" in result.output
    assert "report.html" in result.output
    report = json.loads((run / "report" / "report.json").read_text())
    assert set(report["agreement"]["accuracy_by_orientation"]) == set(ORIENTATIONS)


def test_a_checkpoint_giving_nan_scores_is_refused_by_evaluate_and_predict(tmp_path):
    # a replaced checkpoint pair (digest matching) whose weights hold a NaN: its scores
    # are NaN, and argmax would call every image class 0
    from capsmed.train.checkpoint import save_checkpoint

    run, images = folder_lenet(tmp_path)
    model, meta = load_checkpoint(run)
    with torch.no_grad():
        next(model.parameters())[0].fill_(float("nan"))
    save_checkpoint(run, model, {k: v for k, v in meta.items() if k != "weights_digest"})
    shutil.rmtree(run / "report", ignore_errors=True)
    result = runner.invoke(app, ["-q", "evaluate", str(run)])
    assert_clean_failure(result, "checkpoint.safetensors: the model gives NaN or infinite "
                         "class scores for 6 of 6 images of split 'test'", run / "report")
    out = tmp_path / "pred"
    result = runner.invoke(app, ["-q", "predict", str(run), *map(str, images), "-o", str(out)])
    assert_clean_failure(result, "NaN or infinite class scores for 4 of 4 images scored", out)


def _other_file(path, class_names, size, n=5, like=None, **changed):
    """``n`` random test images; ``like``: a dataset file whose source and preprocessing
    it claims, with ``changed`` parameters."""
    rng = np.random.default_rng(1)
    info = read_info(like) if like else None
    with DatasetWriter(path, dataset=info.dataset if info else "other",
                       kind=info.source_kind if info else "folder",
                       domain=info.domain if info else "generic", class_names=class_names,
                       image_shape=(1, size, size),
                       preprocessing={**(info.preprocessing if info else {}), **changed},
                       source={}) as writer:
        writer.append("test", rng.integers(0, 256, (n, 1, size, size), dtype=np.uint8),
                      np.arange(n) % 2, [f"p{i}" for i in range(n)])
    return path


def test_evaluate_on_another_file_with_the_same_classes(lenet_run, tiny_h5, tmp_path,
                                                         caplog):
    names = list(read_info(tiny_h5).class_names)
    other = _other_file(tmp_path / "other.h5", names, 28)
    result = evaluate_run(lenet_run, data=other, disable_progress=True)
    report = json.loads((result.report_dir / "report.json").read_text())
    assert report["data"] == str(other) and report["dataset"] == "other"
    assert report["samples"] == report["total"]["support"] == 5
    assert report["per_class"][names[1]]["support"] == 2
    assert report["other_data"] and report["other_source"] == "folder"
    assert "other.h5, not the run's file" in (result.report_dir / "report.md").read_text()
    # the run's own source, made otherwise: the differences are said and recorded (a
    # re-split, another seed, is not a difference in how the images look)
    again = _other_file(tmp_path / "again.h5", names, 28, like=tiny_h5, patch_size=50,
                        h_max=0.6, seed=7, positives_per_mitosis=3,
                        negatives_per_image_used={"test": 9})
    with caplog.at_level("WARNING"):
        result = evaluate_run(lenet_run, data=again, disable_progress=True, grids=False)
    report = json.loads((result.report_dir / "report.json").read_text())
    assert report["preprocessing_differs"] == {"h_max": [0.2, 0.6], "patch_size": [100, 50]}
    assert "made with other preprocessing than" in caplog.text
    assert "patch_size: 100 there, 50 here" in caplog.text
    with pytest.raises(CapsmedError, match="images are 1x32x32, the model expects 1x28x28"):
        evaluate_run(lenet_run, data=_other_file(tmp_path / "big.h5", names, 32))
    with pytest.raises(CapsmedError, match=r"classes \['x', 'y'\] do not match"):
        evaluate_run(lenet_run, data=_other_file(tmp_path / "xy.h5", ["x", "y"], 28))



def test_a_file_of_another_data_revision_is_said_to_differ(lenet_run, tiny_h5, tmp_path,
                                                            caplog):
    """The same source and parameters written by a capsmed whose preprocessing made other
    images of some raw files: scored with nothing said, and report.json did not name
    the revision it scored."""
    import h5py

    older = tmp_path / "older.h5"
    shutil.copy(tiny_h5, older)
    with h5py.File(older, "a") as f:
        f.attrs["data_revision"] = 3
    current = read_info(tiny_h5).data_revision
    with caplog.at_level(logging.WARNING):
        result = evaluate_run(lenet_run, data=older, report_name="older", grids=False)
    report = json.loads((result.report_dir / "report.json").read_text())
    assert report["data_revision"] == 3
    assert report["preprocessing_differs"] == {"data_revision": [current, 3]}
    assert f"(data_revision: {current} there, 3 here)" in caplog.text


def test_report_name_keeps_an_evaluation_on_other_data_apart(lenet_run, tiny_h5, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(lenet_run, run, ignore=shutil.ignore_patterns("report*"))
    evaluate_run(run, disable_progress=True, grids=False)
    own = (run / "report" / "report.json").read_text()
    other = _other_file(tmp_path / "other.h5", list(read_info(tiny_h5).class_names), 28)
    result = runner.invoke(app, ["-q", "evaluate", str(run), "--data", str(other),
                                 "--report-name", "report-other", "--no-grids"])
    assert result.exit_code == 0, result.output
    assert json.loads((run / "report-other" / "report.json").read_text())["dataset"] == "other"
    assert (run / "report" / "report.json").read_text() == own
    result = runner.invoke(app, ["-q", "evaluate", str(run), "--report-name", "../x"])
    assert_clean_failure(result, "--report-name must be a plain folder name", tmp_path / "x")


AML_CLASSES = ("BAS", "EBO", "EOS", "KSC", "LYA", "LYT", "MMZ", "MOB", "MON", "MYB", "MYO",
               "NGB", "NGS", "PMB", "PMO")


@pytest.mark.parametrize("names", [("non-mitosis", "mitosis"), AML_CLASSES,
                                   ("a class name far too long for its column", "b")],
                         ids=["tupac16", "aml-15-classes", "long-class-name"])
def test_the_per_class_table_reads_whole_at_80_columns(names):
    """CI logs and pipes are 80 columns: rich's boxed table cut 'sensitiv…'. Headers
    are whole (or their short forms when a long name needs the room), and a class name
    too long for its column is shortened at its spaces, never split over two lines."""
    from rich.console import Console

    from capsmed.evaluate.metrics import classification_report
    from capsmed.evaluate.run_report import HEADERS, SHORT, rich_table

    k = len(names)
    labels = np.arange(10 * k) % k
    predicted = (labels + (np.arange(10 * k) % 3 == 0)) % k
    report = classification_report(labels, predicted, names, scores=np.eye(k)[predicted])
    console = Console(width=80, record=True, color_system=None)
    console.print(rich_table(report, "parallel-dr on aml / test (epoch 700)", width=80))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    header = next(line for line in lines if line.lstrip().startswith("class"))
    assert header.split() in (list(HEADERS), [SHORT.get(h, h) for h in HEADERS])
    text = "\n".join(lines)
    for words in ("Total (macro)", "balanced accuracy", "macro F1", "weighted F1", "AUC"):
        assert words in text
    for name in names:  # whole, or whole words around one '…' on the class's own row
        row = next(line for line in lines if line.startswith(name.split()[0] + " "))
        shown = row.split("  ")[0].strip()
        assert shown == name or ("…" in shown and all(
            w in name.split() for w in shown.replace("…", " ").split())), row
    assert not [line for line in lines if line[:1] == " "]  # no row runs onto a 2nd line


def test_another_file_putting_training_patients_in_the_split_is_warned_about(
        tiny_h5, tmp_path, caplog):
    import h5py

    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train

    run = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                            out=str(tmp_path / "run"),
                            model_kwargs={"widths": [3, 4], "hidden": [8]}),
                disable_progress=True)
    other = tmp_path / "remade.h5"  # the same cases, written again
    shutil.copy(tiny_h5, other)
    with h5py.File(other, "a") as f:
        f.attrs["created"] = "2000-01-01T00:00:00+00:00"
    with caplog.at_level(logging.WARNING):
        evaluate_run(run, data=other, split="test", report_name="t", grids=False)
    assert not [m for m in caplog.messages if "unseen patients" in m]  # its own test cases
    with caplog.at_level(logging.WARNING):
        evaluate_run(run, data=other, split="train", report_name="tr", grids=False)
    (warning,) = [m for m in caplog.messages if "unseen patients" in m]
    assert warning.startswith(f"{other}: 3 of the 3 groups (cases, patients) of its split "
                              f"'train' are in the training split of {tiny_h5}")



def test_a_remade_run_file_is_not_trusted_for_the_patients_trained_on(tiny_h5, tmp_path,
                                                                      caplog):
    """The run's file overwritten since training (re-split, say) and given as --data:
    its own train split is not what the run trained on, so the overlap cannot be
    checked; it was scored with nothing said."""
    import h5py

    data = tmp_path / "data.h5"
    shutil.copy(tiny_h5, data)
    run = capsmed.train_run(data, "lenet", epochs=1, batch_size=16, seed=0, device="cpu",
                            out=str(tmp_path / "run"), model_kwargs=TINY["lenet"])
    with h5py.File(data, "a") as f:
        f.attrs["created"] = "2000-01-01T00:00:00+00:00"
    with caplog.at_level(logging.WARNING):
        result = evaluate_run(run, data=data, report_name="again", grids=False)
    note = (f"{data}: whether its split 'test' holds cases (patients) {run} was trained "
            f"on cannot be checked: the run's file {data} changed since training")
    assert [m for m in caplog.messages if m.startswith(note)]
    assert note in (result.report_dir / "report.md").read_text()


def test_a_cross_validation_run_counts_only_the_patients_of_its_training_folds(tmp_path,
                                                                             caplog):
    """The groups trained on are those of the run's training rows: a CV run's held-out
    fold (in split 'all' too) was called seen in training."""
    import h5py

    from capsmed.data.sources.folder.synth import write_class_folders

    write_class_folders(tmp_path / "images", classes=3, images_per_class=10, patients=5,
                        size=32, seed=0)
    data = capsmed.preprocess("folder", tmp_path / "images", tmp_path / "cv.h5", size=28,
                              channels=1, group_pattern=r"^(P\d+)_", workers=1, folds=5)
    run = capsmed.train_run(data, "lenet", epochs=1, batch_size=16, seed=0, device="cpu",
                            fold=0, out=str(tmp_path / "run"), model_kwargs=TINY["lenet"])
    other = tmp_path / "other.h5"  # the same cases, written again
    shutil.copy(data, other)
    with h5py.File(other, "a") as f:
        f.attrs["created"] = "2000-01-01T00:00:00+00:00"
    groups = load_split(data, "all").groups
    held_out = set(groups[np.load(run / "test_indices.npy")])
    with caplog.at_level(logging.WARNING):
        evaluate_run(run, data=other, split="all", report_name="o", grids=False)
    (warning,) = [m for m in caplog.messages if "unseen patients" in m]
    assert warning.startswith(f"{other}: {5 - len(held_out)} of the 5 groups (cases, "
                              "patients) of its split 'all' are in the training split")
    assert not [g for g in held_out if g in warning]


def _drawn(monkeypatch, module):
    """The figures ``module`` saves, kept open for inspection."""
    figures = []
    monkeypatch.setattr(module, "_save", lambda fig, path: figures.append(fig))
    return figures


def test_the_row_normalised_confusion_matrix_says_n_a_for_a_class_without_samples(
        monkeypatch, tmp_path):
    """Issue 23: it drew 0.00 across the row of a class with no samples (tables: n/a)."""
    from capsmed.evaluate import plots

    figures = _drawn(monkeypatch, plots)
    cm = np.array([[5, 1, 0], [0, 0, 0], [2, 0, 3]])  # class 'b' has no samples
    plots.plot_confusion_matrix(cm, ["a", "b", "c"], tmp_path / "cm.png")
    counts, normalised = figures[0].axes[:2]
    texts = [t.get_text() for t in normalised.texts]
    assert texts[3:6] == ["n/a"] * 3 and texts[:3] == ["0.83", "0.17", "0.00"]
    assert [t.get_text() for t in counts.texts][3:6] == ["0", "0", "0"]
    assert plots.row_normalised(cm).mask[1].all() and not plots.row_normalised(cm).mask[0].any()


def test_training_curves_of_a_short_run_tick_whole_epochs(monkeypatch, tmp_path):
    """Issue 23: two epochs were drawn with ticks at 1.2, 1.4, ... 1.8."""
    from matplotlib.figure import Figure

    from capsmed.train.curves import plot_training_curves

    ticks = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **kw: (
        ticks.extend(ax.get_xticks() for ax in fig.axes), real(fig, *a, **kw)))
    records = [{"epoch": e, "train_loss": 1.0 / e, "train_acc": 0.5, "val_loss": 1.1 / e,
                "val_acc": 0.5, "best": e == 2} for e in (1, 2)]
    plot_training_curves(records, tmp_path / "curves.png")
    assert len(ticks) == 2 and (tmp_path / "curves.png").is_file()
    for axis_ticks in ticks:
        assert all(float(t).is_integer() for t in axis_ticks), axis_ticks


def test_a_flat_perturbation_grid_is_drawn_as_its_scaled_changes_or_said_flat():
    """Issue 23: an undertrained run's grids were uniform grey squares."""
    from capsmed.evaluate.capsule_grids import PerturbationGrid, perturbation_view

    shifts = np.linspace(-0.25, 0.25, 5)
    base = np.full((3, 5, 1, 4, 4), 0.5)
    faint = base + 0.002 * shifts[None, :, None, None, None] * np.arange(3)[:, None,
                                                                             None, None, None]
    images, how = perturbation_view(PerturbationGrid(0, 0, 0, shifts, faint))
    assert images.min() == pytest.approx(0.0) and images.max() == pytest.approx(1.0)
    assert np.allclose(images[0], 0.5) and "scaled" in how and "±0.001" in how
    images, how = perturbation_view(PerturbationGrid(0, 0, 0, shifts, base))
    assert how.startswith("flat: no shift changes any pixel") and np.array_equal(images, base)
    strong = base + 0.8 * shifts[None, :, None, None, None]
    images, how = perturbation_view(PerturbationGrid(0, 0, 0, shifts, strong))
    assert how == "decoded images" and np.array_equal(images, strong)


def test_report_html_lays_several_figures_of_a_section_side_by_side(tmp_path):
    from capsmed.evaluate.html import render_html
    from capsmed.evaluate.metrics import classification_report

    png = tmp_path / "a.png"
    png.write_bytes(base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="))
    report = classification_report(np.array([0, 1]), np.array([0, 1]), ["a", "b"])
    page = render_html(report, "t", {"run_dir": "r"}, figures=[
        ("Confusion matrix", "c", png), ("Capsule dimension perturbations", "p0", png),
        ("Capsule dimension perturbations", "p1", png)])
    assert page.count('<div class="figures">') == 1
    assert page.index('<div class="figures">') > page.index("Capsule dimension")
    assert "<h2>Per-class metrics</h2>" in page and '<tr class="total">' in page


def test_the_terminal_headline_says_which_auc_it_gives():
    """Binary: the positive class's AUC, named; several classes: the macro AUC."""
    from rich.console import Console

    from capsmed.evaluate.metrics import classification_report
    from capsmed.evaluate.run_report import rich_table

    rng = np.random.default_rng(0)
    for names, want in ((["non-mitosis", "mitosis"], "AUC (mitosis) "),
                        (["a", "b", "c"], "macro AUC ")):
        y = np.arange(30) % len(names)
        scores = rng.random((30, len(names)))
        report = classification_report(y, scores.argmax(1), names, scores=scores)
        console = Console(width=80, record=True)
        console.print(rich_table(report, "t", width=80))
        text = console.export_text()
        assert want in text and f"{want}{report.auc:.3f}" in text


def test_the_weights_checked_are_the_weights_loaded(lenet_run, tmp_path, monkeypatch):
    """The checkpoint was hashed and then read again: weights training replaced in
    between were scored under the previous epoch's metadata, without a word."""
    import shutil

    from safetensors.torch import load_file, save_file

    import capsmed.data.digest as digest
    import capsmed.runs.checkpoint as checkpoint

    run = tmp_path / "run"
    shutil.copytree(lenet_run, run)
    kept = load_file(str(run / "checkpoint.safetensors"))
    real = digest.file_digest

    def replaced_after_hashing(path):  # training writes the next epoch's weights
        value = real(path)
        if str(path).endswith("checkpoint.safetensors"):
            save_file({k: v + 1.0 for k, v in kept.items()}, str(path))
        return value

    monkeypatch.setattr(digest, "file_digest", replaced_after_hashing)
    monkeypatch.setattr(checkpoint, "file_digest", replaced_after_hashing, raising=False)
    try:
        model, _ = load_checkpoint(run)
    except CapsmedError:
        return  # refusing the mixed pair is right too
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], kept[k]) for k in kept)
