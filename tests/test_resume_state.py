"""When resume.pt is written (at the start, at most every N minutes, at the end of
training, when stopped) and that a state written at any of those points resumes to
the uninterrupted run's result."""

from __future__ import annotations

import errno
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from capsmed.io import WriteError
from capsmed.train.config import TrainConfig
from capsmed.train.engine import resume, train
from capsmed.train.state import load_state
from capsmed.train.step import TrainStep
from tests.helpers import TINY_CAPSNET

TINY_LENET = {"widths": [3, 4], "hidden": [8]}


class Killed(Exception):
    """As if the process died (SIGKILL, a node lost): nothing is saved on the way out."""


def _caps(data, out, **options):
    base = {"data": str(data), "arch": "capsnet", "epochs": 3, "batch_size": 8, "seed": 2,
            "out": str(out), "model_kwargs": TINY_CAPSNET, "augment": True,
            "sampler": "balanced", "steps_per_epoch": 4, "patience": None}
    return TrainConfig(**{**base, **options})


def _metrics(run):
    return [{k: v for k, v in json.loads(x).items() if k not in ("seconds", "images_per_s")}
            for x in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(run):
    return load_file(str(run / "checkpoint.safetensors"))


def _killed_at(monkeypatch, step):
    original, calls = TrainStep.__call__, {"n": 0}

    def dying(self, x, y, *share):
        calls["n"] += 1
        if calls["n"] == step:
            raise Killed
        return original(self, x, y, *share)

    monkeypatch.setattr(TrainStep, "__call__", dying)
    return lambda: monkeypatch.setattr(TrainStep, "__call__", original)


def test_a_state_written_inside_an_epoch_resumes_to_the_uninterrupted_run(
        tiny_h5, tmp_path, monkeypatch):
    import capsmed.train.loop as loop

    monkeypatch.setattr(loop, "CHECK_EVERY", 2)  # check points inside the 4-step epochs
    whole = train(_caps(tiny_h5, tmp_path / "whole", epochs=2), disable_progress=True)
    revive = _killed_at(monkeypatch, 3)
    with pytest.raises(Killed):  # default interval: nothing written since the start
        train(_caps(tiny_h5, tmp_path / "rare", epochs=2), disable_progress=True)
    assert load_state(tmp_path / "rare")["progress"]["global_step"] == 0
    revive()
    revive = _killed_at(monkeypatch, 7)
    cut = tmp_path / "cut"
    with pytest.raises(Killed):  # 0 minutes: at every check point, the last at step 6
        train(_caps(tiny_h5, cut, epochs=2, state_every_minutes=0), disable_progress=True)
    progress = load_state(cut)["progress"]
    assert (progress["epoch"], progress["step"], progress["global_step"]) == (2, 2, 6)
    revive()
    resumed = resume(cut, disable_progress=True)
    assert _metrics(resumed) == _metrics(whole)
    a, b = _weights(whole), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_early_stop_writes_a_final_state_that_resumes_without_training(
        tiny_h5, tmp_path, monkeypatch):
    import capsmed.train.handlers.summary as summary

    cfg = {"data": str(tiny_h5), "arch": "lenet", "epochs": 12, "batch_size": 16,
           "seed": 1, "model_kwargs": TINY_LENET, "patience": 1, "lr": 0.05}
    whole = train(TrainConfig(**cfg, out=str(tmp_path / "whole")), disable_progress=True)
    expected = json.loads((whole / "summary.json").read_text())
    assert expected["stopped_early"] and expected["epochs_run"] < 12

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(summary, "plot_training_curves", full_disk)
    run = tmp_path / "run"
    with pytest.raises(WriteError, match="curves.png"):
        train(TrainConfig(**cfg, out=str(run)), disable_progress=True)
    assert load_state(run)["progress"]["stopped_early"]
    monkeypatch.undo()
    revive = _killed_at(monkeypatch, 1)  # resuming must not train a single step
    resume(run, disable_progress=True)
    revive()
    assert json.loads((run / "summary.json").read_text()) == expected
    assert _metrics(run) == _metrics(whole) and not (run / "resume.pt").exists()


def test_the_interval_is_an_option_of_train_refused_below_zero(tiny_h5, tmp_path):
    from typer.testing import CliRunner

    from capsmed.cli import app
    from tests.helpers import assert_clean_failure

    args = ["train", "--data", str(tiny_h5), "--arch", "lenet", "--out", str(tmp_path / "r")]
    result = CliRunner().invoke(app, [*args, "--state-every-minutes", "-1"])
    assert_clean_failure(result, "state_every_minutes must be >= 0, got -1.0")
    assert not (tmp_path / "r").exists()


def _crashed_attempts_checkpoint(run, epoch):
    """As if the crashed attempt had kept a later epoch after the state was written."""
    from capsmed.data.digest import file_digest

    weights = {k: v + 1 for k, v in _weights(run).items()}
    meta = json.loads((run / "checkpoint.json").read_text())
    for name in ("checkpoint.safetensors", "checkpoint.json"):
        (run / name).unlink()  # replaced, as save_checkpoint does, not written over
    save_file(weights, str(run / "checkpoint.safetensors"))
    meta.update(epoch=epoch, weights_digest=file_digest(run / "checkpoint.safetensors"))
    (run / "checkpoint.json").write_text(json.dumps(meta))


def test_resume_puts_back_the_checkpoint_of_the_states_kept_epoch(
        tiny_h5, tmp_path, monkeypatch):
    """A replay that is not bit-identical (a GPU) may not keep the crashed attempt's later
    epoch again: its weights must not pass for the resumed run's best."""
    from capsmed.train.loop import TrainingInterrupted

    run = tmp_path / "run"
    revive = _killed_at(monkeypatch, 5)  # in epoch 2: the state of epoch 1's end is last
    with pytest.raises(Killed):
        train(_caps(tiny_h5, run, state_every_minutes=0), disable_progress=True)
    revive()
    assert load_state(run)["progress"]["best_epoch"] == 1
    kept = _weights(run)
    _crashed_attempts_checkpoint(run, epoch=2)
    with pytest.raises(TrainingInterrupted):
        resume(run, disable_progress=True, stop_after_steps=1)
    assert json.loads((run / "checkpoint.json").read_text())["epoch"] == 1
    restored = _weights(run)
    assert all(torch.equal(kept[k], restored[k]) for k in kept)
    resume(run, disable_progress=True)  # finished: the kept pair goes with resume.pt
    assert not list(run.glob("resume*"))
    best = [r["epoch"] for r in _metrics(run) if r["best"]][-1]
    assert json.loads((run / "checkpoint.json").read_text())["epoch"] == best


def test_resume_puts_back_the_kept_weights_under_metadata_of_the_kept_epoch(
        tiny_h5, tmp_path, monkeypatch):
    """A crash between save_checkpoint's two renames leaves a later epoch's weights
    under the kept epoch's metadata: the kept pair is put back all the same."""
    from capsmed.train.loop import TrainingInterrupted

    run = tmp_path / "run"
    revive = _killed_at(monkeypatch, 5)  # in epoch 2: the state of epoch 1's end is last
    with pytest.raises(Killed):
        train(_caps(tiny_h5, run, state_every_minutes=0), disable_progress=True)
    revive()
    kept = _weights(run)
    (run / "checkpoint.safetensors").unlink()  # renamed over: the metadata not yet
    save_file({k: v + 1 for k, v in kept.items()}, str(run / "checkpoint.safetensors"))
    with pytest.raises(TrainingInterrupted):
        resume(run, disable_progress=True, stop_after_steps=1)
    assert json.loads((run / "checkpoint.json").read_text())["epoch"] == 1
    restored = _weights(run)
    assert all(torch.equal(kept[k], restored[k]) for k in kept)


def test_resume_from_the_start_drops_the_crashed_attempts_checkpoint(
        tiny_h5, tmp_path, monkeypatch):
    from capsmed.train.loop import TrainingInterrupted

    run = tmp_path / "run"
    revive = _killed_at(monkeypatch, 6)  # default interval: only the start's state
    with pytest.raises(Killed):
        train(_caps(tiny_h5, run), disable_progress=True)
    revive()
    assert load_state(run)["progress"]["best_epoch"] == 0
    assert (run / "checkpoint.json").is_file()  # epoch 1's, from the lost attempt
    with pytest.raises(TrainingInterrupted):
        resume(run, disable_progress=True, stop_after_steps=1)
    assert not (run / "checkpoint.json").exists()
    assert not (run / "checkpoint.safetensors").exists()


def test_augmentation_draws_of_another_device_type_are_refused_in_words():
    """A run augmented on a GPU and resumed on a CPU (or back) stopped with "does not
    fit this run's model and options (Expected a CPUGeneratorImplState...)", which did
    not name the cause: a generator's state does not move between device types."""
    from capsmed.errors import CapsmedError
    from capsmed.train.state import restore_rng

    cpu = torch.Generator().manual_seed(0)
    base = {"torch_rng": torch.get_rng_state(), "cuda_rng": []}
    recorded = {**base, "augment": cpu.get_state(), "augment_device": "cuda"}
    with pytest.raises(CapsmedError, match="draws were made on cuda: resume it on such a "
                                           r"device \(this run's is cpu\)"):
        restore_rng(recorded, torch.Generator())
    # a state of an older capsmed, without its device type: a CUDA generator's 16 bytes
    older = {**base, "augment": torch.zeros(16, dtype=torch.uint8)}
    with pytest.raises(CapsmedError, match="made on another kind of device"):
        restore_rng(older, torch.Generator())
    same = torch.Generator()
    restore_rng({**base, "augment": cpu.get_state(), "augment_device": "cpu"}, same)
    assert torch.equal(same.get_state(), cpu.get_state())
