"""Exit codes (README "Errors and exit codes"): 1 and one ``error:`` line for bad
input, 130 and one ``error:`` line for an interruption (Ctrl-C, SIGTERM), including a
training run stopped on request, which also says how to resume it."""

from __future__ import annotations

import os
import signal

import pytest

from capsmed.errors import CapsmedError
from tests.faults.common import assert_refused, invoke, lenet_args


def _raiser(exc):
    def describe(*args, **kwargs):
        if isinstance(exc, int):
            os.kill(os.getpid(), exc)
        raise exc
    return describe


@pytest.mark.parametrize("event, code, text", [
    (CapsmedError("x.h5: broken"), 1, "error: x.h5: broken"),
    (CapsmedError("x.h5: first line\n  second line"), 1, "x.h5: first line second line"),
    (KeyboardInterrupt(), 130, "error: interrupted"),
    (signal.SIGTERM, 130, "error: interrupted (SIGTERM)"),
], ids=["error", "multi-line-error", "ctrl-c", "sigterm"])
def test_errors_exit_1_and_interruptions_130(toy_h5, monkeypatch, event, code, text):
    import capsmed.data.describe as describe

    monkeypatch.setattr(describe, "describe_dataset", _raiser(event))
    before = signal.getsignal(signal.SIGTERM)
    result = invoke(["data", "info", toy_h5])
    assert_refused(result, text, code=code)
    assert signal.getsignal(signal.SIGTERM) == before  # the command's handler is gone


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_training_exits_130_and_says_how_to_resume(toy_h5, tmp_path,
                                                               monkeypatch, sig):
    from capsmed.train.step import TrainStep

    original, calls = TrainStep.__call__, {"n": 0}

    def interrupting(self, x, y, *share):
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), sig)
        return original(self, x, y, *share)

    monkeypatch.setattr(TrainStep, "__call__", interrupting)
    run = tmp_path / "run"
    result = invoke(lenet_args(toy_h5, run, "--epochs", "2"))
    assert_refused(result, f"capsmed train --resume {run}", code=130, text=sig.name)
    assert (run / "resume.pt").is_file()
    monkeypatch.setattr(TrainStep, "__call__", original)
    resumed = invoke(["train", "--resume", run])
    assert resumed.exit_code == 0, resumed.output
    assert (run / "summary.json").is_file()


def test_a_second_ctrl_c_stops_at_once_and_points_to_the_saved_state(toy_h5, tmp_path,
                                                                      monkeypatch):
    from capsmed.train.step import TrainStep

    original, calls = TrainStep.__call__, {"n": 0}

    def interrupting(self, x, y, *share):
        calls["n"] += 1
        if calls["n"] == 5:  # epoch 2: epoch 1's end saved a state
            raise KeyboardInterrupt  # what StopRequest raises on a second Ctrl-C
        return original(self, x, y, *share)

    monkeypatch.setattr(TrainStep, "__call__", interrupting)
    run = tmp_path / "run"
    result = invoke(lenet_args(toy_h5, run, "--epochs", "2", "--steps-per-epoch", "3"))
    assert_refused(result, f"capsmed train --resume {run}", code=130,
                   text="interrupted at once")
