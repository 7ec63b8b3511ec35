"""What ``capsmed evaluate`` writes: the report's files agree with each other and with a
hand computation, the page says what was evaluated, and nothing else is overwritten."""

from __future__ import annotations

import csv
import json
import re
import shutil

import numpy as np
import pytest

from capsmed.data.contract import DatasetWriter
from capsmed.errors import CapsmedError
from capsmed.evaluate.curve_plot import plot_curves
from capsmed.evaluate.evaluation import _write_files, evaluate_run
from capsmed.evaluate.html import training_facts
from capsmed.evaluate.metrics import classification_report
from capsmed.evaluate.run_report import write_report
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train

CLASSES = ("a", "b", "c")


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """A LeNet trained one epoch, seed 0, on 28x28 images of three classes."""
    work = tmp_path_factory.mktemp("outputs")
    rng = np.random.default_rng(0)
    with DatasetWriter(work / "toy.h5", dataset="toy", kind="folder", domain="generic",
                       class_names=CLASSES, image_shape=(1, 28, 28), preprocessing={},
                       source={}) as writer:
        for split, n in (("train", 30), ("val", 9), ("test", 9)):
            labels = np.arange(n) % 3
            images = rng.integers(0, 60, (n, 1, 28, 28), dtype=np.uint8)
            for i, label in enumerate(labels):
                images[i, 0, label * 9:label * 9 + 9] += 150
            writer.append(split, images, labels, [f"{split}{i % 3}" for i in range(n)])
    return train(TrainConfig(data=str(work / "toy.h5"), arch="lenet", epochs=1,
                             batch_size=16, seed=0, out=str(work / "run")),
                 disable_progress=True)


def test_a_report_name_that_is_another_folder_of_the_run_is_refused(toy_run, tmp_path):
    """--report-name tensorboard replaced the run's TensorBoard logs with a report."""
    run = tmp_path / "run"
    shutil.copytree(toy_run, run, ignore=shutil.ignore_patterns("report*"))
    logs = run / "tensorboard" / "events.out.tfevents.1"
    logs.parent.mkdir()
    logs.write_text("x")
    with pytest.raises(CapsmedError, match="tensorboard: holds files but no report.json"):
        evaluate_run(run, report_name="tensorboard", grids=False)
    assert sorted(p.name for p in logs.parent.iterdir()) == [logs.name]
    # an earlier report, or an empty folder, is replaced as before
    (run / "report-val").mkdir()
    for _ in range(2):
        evaluate_run(run, split="val", report_name="report-val", grids=False)
    assert json.loads((run / "report-val" / "report.json").read_text())["split"] == "val"


def test_the_page_shows_training_options_set_to_zero(toy_run):
    """seed 0 (and fold 0, a decay of 0) compared equal to False and were left out."""
    facts = training_facts({"train": {"seed": 0, "fold": 0, "lr_decay": 0.0, "folds": 5,
                                      "augment": False, "fraction": None, "imbalance": {},
                                      "transfer_layers": [], "data": "x.h5"}})
    assert facts == {"seed": 0, "fold": 0, "lr_decay": 0.0, "folds": 5}
    evaluate_run(toy_run, grids=False)
    page = (toy_run / "report" / "report.html").read_text()
    assert "<th>seed</th><td>0</td>" in page


def test_the_reconstruction_caption_names_the_split_evaluated(tmp_path):
    """The caption said 'test inputs' for an evaluation of --split val."""
    report = classification_report(np.array([0, 1]), np.array([0, 1]), ["a", "b"])
    images = np.full((2, 1, 8, 8), 0.5, dtype=np.float32)
    recon = {"inputs": images, "reconstructions": images, "labels": np.array([0, 1]),
             "predicted": np.array([0, 1])}
    _write_files(tmp_path, tmp_path, report, "t", {"split": "val"}, None, (recon, []),
                 ("a", "b"), "capsnet")
    page = (tmp_path / "report.html").read_text()
    assert "val inputs and their reconstructions" in page and "test inputs" not in page


def test_a_curve_row_at_zero_on_a_log_axis_is_refused(tmp_path):
    """A row at x = 0 broke the log axis: the other rows drawn on top of each other."""
    x = {"none": 0, "f5": 5, "full": 100}
    ours = {"lenet": {"none": [0.5, 0.6], "f5": [0.8], "full": [0.9]}}
    with pytest.raises(CapsmedError, match=r"none \(x = 0\) at x <= 0.*log_x: false"):
        plot_curves(tmp_path / "c.png", "F1", x, ours)
    assert not list(tmp_path.iterdir())
    assert plot_curves(tmp_path / "c.png", "F1", x, ours, log_x=False) == {"ours": 3,
                                                                           "paper": 0}


def test_report_json_csv_and_md_state_the_hand_computed_numbers(tmp_path):
    """Class order, support, specificity and sensitivity as counted by hand, the same
    in every file (raw in JSON and CSV, three decimals in Markdown)."""
    y_true = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 0])
    y_pred = np.array([0, 1, 0, 1, 2, 2, 2, 0, 2, 0])
    report = classification_report(y_true, y_pred, CLASSES)
    write_report(report, tmp_path, "t", {"split": "test"})
    # class b: TP 1 (sample 3), FN 1 (4 -> c), FP 1 (1 -> b), TN 7
    hand = {"a": (4, 3 / 4, 5 / 6), "b": (2, 1 / 2, 7 / 8), "c": (4, 3 / 4, 5 / 6)}
    data = json.loads((tmp_path / "report.json").read_text())
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    md = (tmp_path / "report.md").read_text()
    assert list(data["per_class"]) == [r["class"] for r in rows[:3]] == list(CLASSES)
    assert data["confusion_matrix"] == [[3, 1, 0], [0, 1, 1], [1, 0, 3]]
    for row, (name, (support, sensitivity, specificity)) in zip(rows, hand.items(),
                                                                strict=False):
        values = data["per_class"][name]
        assert values["support"] == int(row["support"]) == support
        assert values["sensitivity"] == float(row["sensitivity"]) == sensitivity
        assert values["specificity"] == float(row["specificity"]) == specificity
        assert re.search(rf"\| {name} \| [0-9.]+ \| {sensitivity:.3f} \| "
                         rf"{specificity:.3f} \| .* \| {support} \|", md), name
    assert rows[3]["class"] == "total" and int(rows[3]["support"]) == 10


@pytest.mark.parametrize("name", ["total", "Total (macro)"])
def test_a_class_named_like_the_total_row_is_refused(tmp_path, name):
    """A class named 'total' made report.csv hold two 'total' rows: a reader looking up
    the total got the class's numbers (or the other way round)."""
    report = classification_report(np.array([0, 1]), np.array([0, 1]), ["a", name])
    with pytest.raises(CapsmedError, match=f"class '{re.escape(name)}' has the name of "
                                           "the reports' total row"):
        write_report(report, tmp_path, "t", {"split": "test"})
    assert not list(tmp_path.iterdir())


def test_evaluate_refuses_a_class_named_total_before_scoring(tmp_path):
    """preprocess refuses such a class (the writer, and the folder source naming the
    folder); a file written elsewhere (or before) is refused by evaluate, before scoring."""
    import json

    import h5py

    with pytest.raises(CapsmedError, match=r"t\.h5: class 'Total' has the name of"):
        DatasetWriter(tmp_path / "t.h5", dataset="t", kind="folder", domain="generic",
                      class_names=("a", "Total"), image_shape=(1, 28, 28),
                      preprocessing={}, source={})
    assert not list(tmp_path.iterdir())
    rng = np.random.default_rng(0)
    with DatasetWriter(tmp_path / "t.h5", dataset="t", kind="folder", domain="generic",
                       class_names=("a", "b"), image_shape=(1, 28, 28),
                       preprocessing={}, source={}) as writer:
        for split in ("train", "val", "test"):
            writer.append(split, rng.integers(0, 255, (4, 1, 28, 28), dtype=np.uint8),
                          np.arange(4) % 2, [f"{split}{i}" for i in range(4)])
    with h5py.File(tmp_path / "t.h5", "r+") as f:  # as another tool would name them
        for obj in [f, *(f[k] for k in f if "labels" in f[k])]:
            for holder in (obj, obj.get("labels")):
                if holder is not None and "class_names" in holder.attrs:
                    holder.attrs["class_names"] = json.dumps(["a", "total"])
    run = train(TrainConfig(data=str(tmp_path / "t.h5"), arch="lenet", epochs=1,
                            batch_size=4, seed=0, out=str(tmp_path / "run")),
                disable_progress=True)
    with pytest.raises(CapsmedError, match=r"t\.h5: class 'total' has the name of"):
        evaluate_run(run, grids=False)
    assert not (run / "report").exists()


def test_tracked_metrics_keep_classes_apart_whose_names_map_to_one_word():
    """'a:b' and 'a?b' both became 'a_b': one class's numbers overwrote the other's."""
    from capsmed.evaluate.run_report import tracked_metrics

    report = classification_report(np.array([0, 0, 1, 1]), np.array([0, 0, 0, 1]),
                                   ["a:b", "a?b", "c"])
    values = tracked_metrics(report, "test")
    assert {k: v for k, v in values.items() if k.startswith("test/sensitivity.")} == {
        "test/sensitivity.a_b-0": 1.0, "test/sensitivity.a_b-1": 0.5}
    assert "test/precision.c" not in values  # never predicted, no samples: undefined


def test_cells_on_other_cv_folds_are_not_called_identical():
    """Every run predicting class a: capsnet's folds 0 and 1 and lenet's folds 0 and 2
    gave the same digests (folds of one size), and the note said the cells could not
    differ, though their accuracies do (other images on fold 1 and fold 2)."""
    from pathlib import Path

    from capsmed.evaluate.aggregate import EvaluatedRun
    from capsmed.evaluate.caveats import identical_cells

    truth = {0: [0, 0, 1, 1], 1: [0, 1, 1, 1], 2: [0, 0, 0, 1]}

    def run(arch, fold):
        report = classification_report(np.array(truth[fold]), np.zeros(4, int), ("a", "b"))
        return EvaluatedRun(path=Path(f"{arch}-{fold}"), dataset="d", arch=arch,
                            protocol="CV", settings={}, seed=0, fold=fold,
                            class_names=("a", "b"), metrics={"accuracy": report.accuracy},
                            per_class={}, confusion=report.confusion, data_file="x",
                            predictions=report.predictions_digest)

    capsnet, lenet = [run("capsnet", 0), run("capsnet", 1)], [run("lenet", 0), run("lenet", 2)]
    assert [r.metrics["accuracy"] for r in capsnet] != [r.metrics["accuracy"] for r in lenet]
    assert identical_cells({"capsnet": capsnet, "lenet": lenet}) == []
    same_folds = [run("lenet", 0), run("lenet", 1)]  # fold for fold: identical indeed
    assert identical_cells({"capsnet": capsnet, "lenet": same_folds}) == [["capsnet", "lenet"]]


def test_the_fraction_plot_legend_names_architectures_of_every_panel(monkeypatch, tmp_path):
    """The legend was the last panel's: capsnet, run on MNIST only, drew an unnamed line."""
    import capsmed.evaluate.fraction_plot as fraction_plot
    from capsmed.evaluate.aggregate import Stat

    drawn = {}
    monkeypatch.setattr(fraction_plot, "save_figure",
                        lambda fig, path, **kw: drawn.setdefault("fig", fig))
    points = [(0.1, Stat(0.7, 0.01, 2)), (1.0, Stat(0.9, 0.01, 2))]
    family = fraction_plot.FractionFamily("full", {
        "mnist": {"capsnet": points, "lenet": points}, "tupac16": {"lenet": points}})
    fraction_plot.plot_fraction_family(family, "macro_f1", "macro F1", tmp_path / "f.png")
    legends = [ax.get_legend() for ax in drawn["fig"].axes if ax.get_legend()]
    assert [[t.get_text() for t in legend.get_texts()] for legend in legends] == [
        ["capsnet", "lenet"]]
