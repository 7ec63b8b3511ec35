"""A full disk (ENOSPC injected into one write) during training or evaluation: one line
naming the file, no temporary left, the earlier files whole, and for training the
command that continues once there is room."""

from __future__ import annotations

import errno
import json
import pathlib
import shutil

import pytest

from tests.faults.common import assert_refused, invoke, lenet_args


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _fail_call(module, name, call):
    """Make the ``call``-th call of ``module.name`` fail with ENOSPC."""
    real, seen = getattr(module, name), {"n": 0}

    def failing(*args, **kwargs):
        seen["n"] += 1
        return _enospc() if seen["n"] == call else real(*args, **kwargs)
    return failing


def _fail_path_method(monkeypatch, method, match):
    """Make ``Path.<method>`` fail with ENOSPC on paths whose name contains ``match``."""
    real = getattr(pathlib.Path, method)

    def failing(self, *args, **kwargs):
        if match in self.name and (method != "open" or "a" in (args[0] if args else "")):
            _enospc()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, method, failing)


def _state_at_epoch_end(monkeypatch):
    import torch

    import capsmed.train.state as state

    # call 1 is the state saved at start, call 2 the one at epoch 1's end
    monkeypatch.setattr(state.torch, "save", _fail_call(torch, "save", 2))
    return "resume.pt"


def _checkpoint_weights(monkeypatch):
    import capsmed.train.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint, "save_file", _fail_call(checkpoint, "save_file", 2))
    return "checkpoint.safetensors"


def _metrics_line(monkeypatch):
    _fail_path_method(monkeypatch, "open", "metrics.jsonl")
    return "metrics.jsonl"


def _curves(monkeypatch):
    import matplotlib.figure

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", _enospc)
    return "curves.png"


TRAINING = {"resume-state": _state_at_epoch_end, "checkpoint": _checkpoint_weights,
            "metrics-line": _metrics_line, "curves": _curves}


@pytest.mark.parametrize("case", TRAINING, ids=list(TRAINING))
def test_a_full_disk_during_training_is_one_line_and_the_run_resumes(toy_h5, tmp_path,
                                                                    monkeypatch, case):
    run = tmp_path / "run"
    name = TRAINING[case](monkeypatch)
    line = assert_refused(invoke(lenet_args(toy_h5, run, "--epochs", "2")), run / name,
                          text="cannot write (no space left on device)")
    assert f"capsmed train --resume {run}" in line
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")], "temporary left"
    monkeypatch.undo()  # room again
    resumed = invoke(["train", "--resume", run])
    assert resumed.exit_code == 0, resumed.output
    epochs = [json.loads(x)["epoch"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2] and (run / "summary.json").is_file()


def _report_html(monkeypatch):
    _fail_path_method(monkeypatch, "write_text", ".report.html.")
    return "report.html"


def _confusion_png(monkeypatch):
    _curves(monkeypatch)
    return ""  # a figure: the report folder is named


EVALUATION = {"report-html": _report_html, "confusion-png": _confusion_png}


@pytest.mark.parametrize("earlier", [False, True], ids=["first", "over-an-earlier-one"])
@pytest.mark.parametrize("case", EVALUATION, ids=list(EVALUATION))
def test_a_full_disk_during_evaluation_leaves_no_partial_report(run_copy, monkeypatch,
                                                                case, earlier):
    report = run_copy / "report"
    before = {}
    if earlier:
        assert invoke(["evaluate", run_copy]).exit_code == 0
        before = {p: p.read_bytes() for p in report.iterdir()}
    name = EVALUATION[case](monkeypatch)
    assert_refused(invoke(["evaluate", run_copy]), report / name if name else report,
                   text="cannot write (no space left on device)",
                   absent=[] if earlier else [report], unchanged=before)
    if earlier:
        assert sorted(report.iterdir()) == sorted(before)
    assert not [p.name for p in run_copy.iterdir() if p.name.startswith(".report")]


def test_a_new_report_replaces_the_earlier_one_whole(run_copy):
    assert invoke(["evaluate", run_copy]).exit_code == 0
    (run_copy / "report" / "stale.txt").write_text("from an older capsmed")
    assert invoke(["evaluate", run_copy, "--no-grids"]).exit_code == 0
    assert not (run_copy / "report" / "stale.txt").exists()
    assert (run_copy / "report" / "report.json").is_file()
    assert not [p for p in run_copy.iterdir() if p.name.startswith(".report")]
    shutil.rmtree(run_copy / "report")
