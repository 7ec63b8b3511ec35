"""Tables that would mislead, said so (issue 23, items 5 and 8): ``capsmed report`` and
the study tables warn about and mark a run whose training had not finished, and say when
cells rest on identical predictions or runs predict one class for every image."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace

import numpy as np
import pytest
import yaml

from capsmed.evaluate.aggregate import collect_runs, load_evaluated_run
from capsmed.evaluate.caveats import UNFINISHED, cell_notes, identical_cells, one_class
from capsmed.evaluate.evaluation import evaluate_run
from tests.faults.common import TINY_LENET, runner


def _report(*args):
    from capsmed.cli import app

    return runner.invoke(app, ["report", *map(str, args)], terminal_width=200)


def _interrupted_after_epoch_1(data, out, seed):
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train
    from capsmed.train.loop import TrainingInterrupted

    with pytest.raises(TrainingInterrupted):  # 48 training images, batch 16: 3 steps
        train(TrainConfig(data=str(data), arch="lenet", epochs=3, batch_size=16, seed=seed,
                          out=str(out), model_kwargs=TINY_LENET), disable_progress=True,
              stop_after_steps=3)
    return out


def test_report_warns_about_and_marks_an_unfinished_run(toy_h5, toy_run, tmp_path, caplog):
    from capsmed.evaluate.aggregate_report import report_runs

    runs = tmp_path / "runs"
    shutil.copytree(toy_run, runs / "done")
    cut = _interrupted_after_epoch_1(toy_h5, runs / "cut", seed=1)
    assert (cut / "resume.pt").is_file() and (cut / "checkpoint.json").is_file()
    for run in (runs / "done", cut):
        evaluate_run(run, device="cpu", grids=False)
    with caplog.at_level(logging.WARNING, logger="capsmed"):
        report_runs([runs], tmp_path / "rep")
    # (evaluate said it too, of its own report: "The run's training had not finished")
    (warning,) = [m for m in caplog.messages if "had not finished" in m and "trained" in m]
    assert f"{cut}: trained 1 of 3 epochs" in warning and "capsmed train --resume" in warning
    md = (tmp_path / "rep" / "table_macro_f1.md").read_text()
    (row,) = [line for line in md.splitlines() if line.startswith("| toy ")]
    assert row.rstrip(" |").endswith(UNFINISHED)  # the cell is marked
    assert f"{UNFINISHED}: the cell averages 1 run(s) whose training had not finished: " \
           f"{cut} (trained 1 of 3 epochs)" in md
    result = _report(runs, "-o", tmp_path / "rep")
    assert result.exit_code == 0, result.output
    assert UNFINISHED in result.output and "had not finished" in result.stderr
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    states = {r["path"]: r["unfinished"] for r in summary["runs"]}
    assert states == {str(runs / "done"): None, str(cut): "trained 1 of 3 epochs"}
    assert "\\dag{}" in (tmp_path / "rep" / "table_macro_f1.tex").read_text()
    # the CSVs say it too: a column of each cell's unfinished runs
    import csv

    with (tmp_path / "rep" / "table_macro_f1.csv").open() as f:
        (row,) = [r for r in csv.DictReader(f) if r["dataset"] == "toy"]
    assert [row[k] for k in row if k.endswith(" unfinished")] == ["1"]
    with (tmp_path / "rep" / "per_class_pooled.csv").open() as f:
        assert {r["unfinished_runs"] for r in csv.DictReader(f)} == {"1"}
    with (tmp_path / "rep" / "groups.csv").open() as f:
        assert {r["unfinished"] for r in csv.DictReader(f)} == {"1"}


def test_report_says_when_cells_rest_on_identical_predictions(toy_run, tmp_path):
    runs = tmp_path / "runs"
    for name, fraction in (("full", 1.0), ("half", 0.5)):
        shutil.copytree(toy_run, runs / name)
        config = yaml.safe_load((runs / name / "config.yaml").read_text())
        config["train"]["fraction"] = fraction  # two protocols, one set of predictions
        (runs / name / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        evaluate_run(runs / name, device="cpu", grids=False)
    digests = {json.loads((runs / n / "report" / "report.json").read_text())[
        "predictions_digest"] for n in ("full", "half")}
    assert len(digests) == 1 and len(next(iter(digests))) == 16
    result = _report(runs, "-o", tmp_path / "rep")
    assert result.exit_code == 0, result.output
    md = " ".join((tmp_path / "rep" / "table_macro_f1.md").read_text().split())
    assert "toy, fraction 0.5 / lenet and toy, full / lenet rest on identical " \
           "predictions" in md or "toy, full / lenet and toy, fraction 0.5 / lenet rest " \
           "on identical predictions" in md


def test_only_cells_predicting_the_same_labels_run_for_run_are_called_identical(
        run_copy):
    evaluate_run(run_copy, device="cpu", grids=False)
    run = load_evaluated_run(run_copy)
    other = replace(run, predictions="0" * 16, path=run_copy.parent / "other")
    assert identical_cells({"a": [run], "b": [replace(run, path=run_copy.parent / "b")]}) \
        == [["a", "b"]]
    assert identical_cells({"a": [run], "b": [other]}) == []
    assert identical_cells({"a": [run, other], "b": [run]}) == []  # not run for run
    older = replace(run, predictions=None)  # a report written before the digest
    assert identical_cells({"a": [older], "b": [older]}) == []


def test_a_run_predicting_one_class_is_named(toy_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(toy_run, copy)
    evaluate_run(copy, device="cpu", grids=False)
    run = load_evaluated_run(copy)
    flat = replace(run, confusion=np.array([[8, 0], [8, 0]]))
    assert one_class(flat) and not one_class(replace(run, confusion=np.eye(2, dtype=int)))
    (note,) = cell_notes({"a": [flat]})
    assert note.startswith("1 run(s) predict one class for every test image") \
        and str(copy) in note
    assert [r.unfinished for r in collect_runs([copy]).runs] == [None]


def test_the_study_table_marks_unfinished_runs_and_names_identical_cells(run_copy):
    """The smoke study's capsnet full and half showed one macro F1 with no word why."""
    from types import SimpleNamespace

    from capsmed.pipeline.study import metric_table

    evaluate_run(run_copy, device="cpu", grids=False)
    run = load_evaluated_run(run_copy)
    specs = [SimpleNamespace(fields={"condition": c, "arch": "capsnet", "seed": s})
             for c in ("full", "half") for s in (0, 1)]
    reports = [replace(run, path=run_copy.parent / f"r{i}",
                       predictions=f"{i % 2:016d}",  # seed s predicts alike in both
                       unfinished="trained 1 of 3 epochs" if i == 3 else None)
               for i in range(4)]
    found = [(spec, 0.5 + 0.1 * (i % 2)) for i, spec in enumerate(specs)]
    spec = {"title": "Macro F1", "rows": "condition", "columns": "arch"}
    table, numbers = metric_table(spec, found, list(zip(specs, reports, strict=True)))
    assert table.rows == [["full", "0.550 ± 0.071 (n=2)"],
                          ["half", f"0.550 ± 0.071 (n=2) {UNFINISHED}"]]
    assert numbers["cells"]["half|capsnet"]["unfinished"] == 1
    notes = " ".join(table.notes)
    assert "full / capsnet and half / capsnet rest on identical predictions" in notes
    assert f"{run_copy.parent / 'r3'} (trained 1 of 3 epochs)" in notes
    different = [replace(r, predictions=f"{i:016d}") for i, r in enumerate(reports)]
    table, _ = metric_table(spec, found, list(zip(specs, different, strict=True)))
    assert "identical" not in " ".join(table.notes)


def test_the_report_files_of_an_unfinished_run_say_so(toy_h5, tmp_path, caplog):
    """Not only a warning on the terminal: report.md, .html and .json are read on their
    own, and they showed the epoch 1 checkpoint as if it were the run's result."""
    cut = _interrupted_after_epoch_1(toy_h5, tmp_path / "cut", seed=1)
    with caplog.at_level(logging.WARNING, logger="capsmed"):
        evaluate_run(cut, device="cpu", grids=False)
    said = "The run's training had not finished (resume.pt is there): this scores its " \
           "epoch 1 checkpoint, not the final one"
    assert said in " ".join(caplog.text.split())
    report = json.loads((cut / "report" / "report.json").read_text())
    assert report["notes"][0].startswith(said)
    for name in ("report.md", "report.html"):  # (HTML escapes the apostrophe)
        text = " ".join((cut / "report" / name).read_text().split())
        assert said.split("): ")[1] in text and "training had not finished" in text, name


def test_a_stopped_run_whose_resume_state_was_deleted_is_still_unfinished(
        toy_h5, toy_run, tmp_path, caplog):
    """resume.pt is large, and users delete it: the folder then held an intermediate
    epoch's checkpoint and no summary.json, and evaluate, report and runs ls took it for
    a finished run (no note, no †, no 1/3)."""
    from capsmed.cli import app
    from capsmed.evaluate.aggregate_report import report_runs

    runs = tmp_path / "runs"
    shutil.copytree(toy_run, runs / "done")
    cut = _interrupted_after_epoch_1(toy_h5, runs / "cut", seed=1)
    for name in ("resume.pt", "resume-checkpoint.safetensors", "resume-checkpoint.json"):
        (cut / name).unlink()  # to save disk
    assert not (cut / "summary.json").exists()
    with caplog.at_level(logging.WARNING, logger="capsmed"):
        for run in (runs / "done", cut):
            evaluate_run(run, device="cpu", grids=False)
    why = "no summary.json, and its resumable state was removed"
    notes = {r: json.loads((r / "report" / "report.json").read_text())["notes"]
             for r in (runs / "done", cut)}
    assert not any("had not finished" in n for n in notes[runs / "done"])
    assert notes[cut][0].startswith(f"The run's training had not finished ({why}): this "
                                    "scores its epoch 1 checkpoint, not the final one; it "
                                    "cannot be resumed")
    report_runs([runs], tmp_path / "rep")
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert {r["path"]: r["unfinished"] for r in summary["runs"]} == {
        str(runs / "done"): None, str(cut): f"trained 1 of 3 epochs; {why}"}
    (row,) = [line for line in (tmp_path / "rep" / "table_macro_f1.md").read_text()
              .splitlines() if line.startswith("| toy ")]
    assert row.rstrip(" |").endswith(UNFINISHED)
    listed = runner.invoke(app, ["runs", "ls", str(runs), "--json"])
    assert listed.exit_code == 0, listed.output
    assert {r["run"]: (r["epochs_run"], r["epochs_planned"])
            for r in json.loads(listed.stdout)} == {"done": (1, None), "cut": (1, 3)}
