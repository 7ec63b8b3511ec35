"""A run's folder is written whole at start (rows, config.yaml, a resumable state), so
a run refused at start leaves nothing and one killed at any moment resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from capsmed.errors import CapsmedError
from tests.faults.common import assert_refused, invoke, lenet_args
from tests.helpers import TINY_FC


class Killed(BaseException):
    """Stands for SIGKILL: no handler runs, nothing is saved."""


def _cfg(data, out):
    from capsmed.train.config import TrainConfig

    # baseline: dropout draws from the global RNG, so its state must resume exactly
    return TrainConfig(data=str(data), arch="baseline", epochs=2, batch_size=8, seed=4,
                       out=str(out), model_kwargs=TINY_FC, augment=True, steps_per_epoch=3,
                       patience=None)


def _metrics(run):
    return [{k: v for k, v in json.loads(line).items() if k not in ("seconds", "images_per_s")}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_run_killed_in_its_first_epoch_resumes_to_the_same_result(toy_h5, tmp_path,
                                                                    monkeypatch):
    from capsmed.train.engine import resume, train
    from capsmed.train.step import TrainStep

    whole = train(_cfg(toy_h5, tmp_path / "whole"), disable_progress=True)
    original, calls = TrainStep.__call__, {"n": 0}

    def dying(self, x, y, *share):
        calls["n"] += 1
        if calls["n"] == 2:
            raise Killed
        return original(self, x, y, *share)

    monkeypatch.setattr(TrainStep, "__call__", dying)
    with pytest.raises(Killed):
        train(_cfg(toy_h5, tmp_path / "cut"), disable_progress=True)
    monkeypatch.setattr(TrainStep, "__call__", original)
    cut = tmp_path / "cut"
    assert sorted(p.name for p in cut.iterdir()) == ["config.yaml", "preprocessing.json",
                                                     "resume.pt", "train_indices.npy"]
    resumed = resume(cut, disable_progress=True)
    assert _metrics(resumed) == _metrics(whole)
    a, b = (load_file(str(r / "checkpoint.safetensors")) for r in (whole, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_refused_during_set_up_leaves_nothing(toy_h5, tmp_path, monkeypatch):
    import capsmed.train.run as run_module

    def refuse(*args, **kwargs):
        raise CapsmedError("schedule: refused for the test")

    monkeypatch.setattr(run_module, "build_schedule", refuse)
    run = tmp_path / "run"
    assert_refused(invoke(lenet_args(toy_h5, run)), "schedule: refused", absent=[run])
    monkeypatch.undo()
    assert invoke(lenet_args(toy_h5, run)).exit_code == 0


def test_an_empty_folder_given_as_out_is_used_and_left_empty_on_refusal(toy_h5, tmp_path):
    run = tmp_path / "made-by-a-scheduler"
    run.mkdir()
    assert_refused(invoke(lenet_args(toy_h5, run, "--lr", "nan")), "lr", absent=[run])
    assert run.is_dir()
    assert invoke(lenet_args(toy_h5, run)).exit_code == 0
    assert (run / "summary.json").is_file()


@pytest.mark.slow
def test_sigkill_in_the_first_epoch_then_resume(toy_h5, tmp_path):
    """The real thing: SIGKILL a training process as soon as its folder exists."""
    from capsmed.train.engine import resume
    from capsmed.train.loop import TrainingInterrupted

    run = tmp_path / "run"
    args = [sys.executable, "-m", "capsmed", "-q",
            *map(str, lenet_args(toy_h5, run, "--steps-per-epoch", "100000"))]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (run / "resume.pt").is_file() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.05)
    time.sleep(0.5)  # inside the first epoch (100,000 steps)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run / "metrics.jsonl").exists()  # no epoch finished
    with pytest.raises(TrainingInterrupted, match="epoch 1, step 3"):
        resume(run, disable_progress=True, stop_after_steps=3)
