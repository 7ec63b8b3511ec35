"""The inspection commands show what the files hold: ``capsmed data info`` loses no name
to markup and reports no leak as ok; ``capsmed report`` orders its columns as asked and
deletes nothing it did not write."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import DatasetWriter

runner = CliRunner()


def _write(path, class_names, groups, folds=None, split="train", **attrs):
    n = len(groups)
    with DatasetWriter(path, dataset=attrs.pop("dataset", "toy"), kind="folder",
                       domain="generic", class_names=class_names, image_shape=(1, 4, 4),
                       preprocessing=attrs.pop("preprocessing", {}),
                       source=attrs.pop("source", {}), **attrs) as writer:
        writer.append(split, np.zeros((n, 1, 4, 4), np.uint8), np.arange(n) % 2, groups,
                      folds=folds)
    return path


def test_data_info_flags_groups_that_span_cv_folds(tmp_path):
    # allowed at write time, but a fold-level leak all the same: info must not say "ok"
    path = _write(tmp_path / "cv.h5", ["a", "b"], ["p1", "p1", "p2", "p3"],
                  folds=np.array([0, 1, 1, 0]), split="all", allow_group_leak=True)
    result = runner.invoke(app, ["data", "info", str(path)], terminal_width=120)
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if "group leak check" in ln)
    assert "LEAK: p1 in folds 0+1 of 'all'" in line and "ok" not in line
    printed = json.loads(runner.invoke(app, ["data", "info", str(path), "--json"]).stdout)
    assert printed["fold_leaks"] == {"all": {"p1": [0, 1]}} and printed["leaks"] == {}


def test_data_info_says_ok_for_groups_kept_within_folds(tmp_path):
    path = _write(tmp_path / "cv.h5", ["a", "b"], ["p1", "p1", "p2", "p3"],
                  folds=np.array([0, 0, 1, 1]), split="all")
    result = runner.invoke(app, ["data", "info", str(path)], terminal_width=120)
    assert "ok: no group in two splits or two folds" in result.output
    printed = json.loads(runner.invoke(app, ["data", "info", str(path), "--json"]).stdout)
    assert printed["fold_leaks"] == {}


def test_data_info_shows_bracketed_names_as_written(tmp_path):
    # rich markup took "[a]" for a tag: groups p[a] and p[b] both showed as "p"
    path = _write(tmp_path / "b.h5", ["grade [low]", "grade [high]"],
                  ["p[a]", "p[b]", "p[a]", "p[b]"], dataset="scan [v2]",
                  preprocessing={"note": "[red]kept"}, source={"raw_dir": "/raw [copy]"})
    result = runner.invoke(app, ["data", "info", str(path)], terminal_width=200)
    assert result.exit_code == 0, result.output
    for text in ("scan [v2]", "grade [low]", "grade [high]", "p[a], p[b]", "[red]kept",
                 "/raw [copy]"):
        assert text in result.output, text


def test_data_info_json_says_what_the_table_says_of_revision_and_leak_check(tmp_path):
    # --json left out the table's data revision and its "not checked" leak line: a
    # per-image file read as "leaks": {}, a passed check
    from capsmed.data.contract import DATA_REVISION

    per_image = _write(tmp_path / "p.h5", ["a", "b"], ["i1", "i2", "i3", "i4"])
    result = runner.invoke(app, ["data", "info", str(per_image)], terminal_width=200)
    assert "not checked: every image is its own group" in result.output
    printed = json.loads(runner.invoke(app, ["data", "info", str(per_image), "--json"]).stdout)
    assert printed["leak_check"] == "not checked" and printed["leaks"] == {}
    assert printed["data_revision"] == printed["current_data_revision"] == DATA_REVISION
    assert f"{DATA_REVISION} (this capsmed's)" in result.output
    patients = _write(tmp_path / "g.h5", ["a", "b"], ["p1", "p1", "p2", "p2"])
    printed = json.loads(runner.invoke(app, ["data", "info", str(patients), "--json"]).stdout)
    assert printed["leak_check"] == "ok"
    spanning = _write(tmp_path / "cv.h5", ["a", "b"], ["p1", "p1", "p2", "p3"],
                      folds=np.array([0, 1, 1, 0]), split="all", allow_group_leak=True)
    printed = json.loads(runner.invoke(app, ["data", "info", str(spanning), "--json"]).stdout)
    assert printed["leak_check"] == "leak"


def test_data_info_shows_recorded_parameters_with_their_own_letters(tmp_path):
    # a list or mapping parameter was shown as JSON with \u escapes: class folders
    # "été" and "冬" read ["\u00e9t\u00e9", "\u51ac"]
    path = _write(tmp_path / "u.h5", ["été", "冬"], ["p1", "p1", "p2", "p2"],
                  preprocessing={"classes": ["été", "冬"]})
    result = runner.invoke(app, ["data", "info", str(path)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert '["été", "冬"]' in result.output and "\\u" not in result.output


def _run(dataset, arch, seed, f1):
    from capsmed.evaluate.aggregate import EvaluatedRun
    from capsmed.train.protocol import protocol_label, protocol_settings

    settings = protocol_settings({})
    return EvaluatedRun(path=Path(f"/runs/{dataset}-{arch}-{seed}"), dataset=dataset,
                        arch=arch, protocol=protocol_label(settings), settings=settings,
                        seed=seed, fold=None, class_names=("a", "b"),
                        metrics={"macro_f1": f1}, per_class={"a": {}, "b": {}},
                        confusion=np.array([[1, 0], [0, 1]]))


@pytest.mark.parametrize("archs", [(), ("lenet", "capsnet"), ("capsnet", "lenet")])
def test_report_metric_table_columns_follow_arch_order_across_datasets(archs, tmp_path):
    # dataset "aaa" has lenet only; sorted first, it used to put lenet's column first
    # whatever --arch said (and not alphabetically without it)
    from capsmed.evaluate.aggregate import Collection
    from capsmed.evaluate.aggregate_report import ReportConfig, report_runs

    runs = [_run("aaa", "lenet", 1, 0.5), _run("bbb", "capsnet", 1, 0.9),
            _run("bbb", "lenet", 1, 0.7)]
    result = report_runs([], tmp_path / "report", ReportConfig(archs=archs),
                         Collection(runs=runs, skipped=[]))
    order = list(archs) or ["capsnet", "lenet"]
    assert [c.header for c in result.printed[0].columns[1:]] == order
    value = {"capsnet": {"aaa": "", "bbb": "0.9"}, "lenet": {"aaa": "0.5", "bbb": "0.7"}}
    csv = (tmp_path / "report" / "table_macro_f1.csv").read_text().splitlines()
    assert csv == ["dataset," + ",".join(f"full / {a} {k}" for a in order
                                         for k in ("mean", "std", "n", "unfinished"))] + [
        ",".join([d, *(v for a in order for v in (
            (value[a][d], "", "1", "0") if value[a][d] else ("", "", "", "")))])
        for d in ("aaa", "bbb")]


def _report(tmp_path, out):
    from capsmed.evaluate.aggregate import Collection
    from capsmed.evaluate.aggregate_report import ReportConfig, report_runs

    runs = [_run("bbb", "capsnet", 1, 0.9), _run("bbb", "lenet", 1, 0.7)]
    return report_runs([tmp_path], out, ReportConfig(), Collection(runs=runs, skipped=[]))


def test_report_never_replaces_an_earlier_report_folder_holding_other_things(tmp_path):
    from capsmed.errors import CapsmedError

    out = tmp_path / "exp"
    _report(tmp_path, out)
    _report(tmp_path, out)  # an earlier report alone is replaced
    written = sorted(p.name for p in out.iterdir())
    # a run trained into the report's folder (or a note) went with the old report
    run = out / "run-1"
    run.mkdir()
    (run / "checkpoint.safetensors").write_bytes(b"weights")
    with pytest.raises(CapsmedError, match=r"exp: holds run-1, not written by its "
                                           r"capsmed report; .* would delete it"):
        _report(tmp_path, out)
    assert (run / "checkpoint.safetensors").read_bytes() == b"weights"
    assert sorted(p.name for p in out.iterdir()) == sorted([*written, "run-1"])
