"""Training that goes wrong stops with one line saying exactly what it kept: a
non-finite loss in training or validation, a full disk, a read-only disk, an empty
training split."""

from __future__ import annotations

import math

import pytest
import torch

from tests.faults.common import assert_refused, invoke, lenet_args


def _poison_validation(monkeypatch, epochs):
    import capsmed.train.loop as loop

    real, seen = loop.evaluate_loss, {"n": 0}

    def evaluate_loss(run, data):
        seen["n"] += 1
        result = real(run, data)
        return {**result, "val_loss": math.nan} if seen["n"] in epochs else result

    monkeypatch.setattr(loop, "evaluate_loss", evaluate_loss)


def _poison_training(monkeypatch, step):
    import capsmed.train.step as step_module

    real, seen = step_module.training_loss, {"n": 0}

    def training_loss(*args, **kwargs):
        loss = real(*args, **kwargs)
        if torch.is_grad_enabled():
            seen["n"] += 1
            if seen["n"] == step:
                return loss * math.inf
        return loss

    monkeypatch.setattr(step_module, "training_loss", training_loss)


# id: (poison, text of the error line, checkpoint epoch kept or None)
NON_FINITE = {
    "first-validation-nan": (lambda m: _poison_validation(m, {1}),
                             "validation loss of epoch 1 is NaN/inf", None),
    "second-validation-nan": (lambda m: _poison_validation(m, {2}),
                              "validation loss of epoch 2 is NaN/inf", 1),
    "first-step-inf": (lambda m: _poison_training(m, 1), "NaN/inf at step 1 (epoch 1)", None),
    "fourth-step-inf": (lambda m: _poison_training(m, 4), "NaN/inf at step 4 (epoch 2)", 1),
}


@pytest.mark.parametrize("case", NON_FINITE, ids=list(NON_FINITE))
def test_a_non_finite_loss_stops_and_says_what_was_kept(toy_h5, tmp_path, monkeypatch, case):
    poison, text, kept = NON_FINITE[case]
    poison(monkeypatch)
    run = tmp_path / "run"
    line = assert_refused(invoke(lenet_args(toy_h5, run, "--epochs", "3")), run, text=text)
    assert "run saved" not in line
    if kept is None:
        assert "no checkpoint was written" in line
        assert not (run / "checkpoint.json").exists()
    else:
        assert f"the checkpoint of epoch {kept} (selection loss" in line
        assert (run / "checkpoint.json").is_file()
    assert not (run / "summary.json").exists()  # not a finished run


def _read_only(monkeypatch):
    import os
    import shutil

    import capsmed.train.run as run_module

    real = os.statvfs

    def statvfs(path):
        values = list(real(path))
        values[8] |= os.ST_RDONLY  # f_flag: of every mount, typer does not ask
        return os.statvfs_result(values)

    monkeypatch.setattr(run_module.os, "statvfs", statvfs)
    # what a read-only mount may report as free: the old message blamed the space
    monkeypatch.setattr(run_module.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(2**30, 2**30 - 2**20, 2**20))


def _not_writable(monkeypatch, folder):
    import os
    from pathlib import Path

    real = os.access  # only the run's parent folder (typer checks --data with it too)
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != folder
                        and real(path, mode))


def _empty_train_split(monkeypatch, data):
    import h5py

    with h5py.File(data, "r+") as f:
        for name in ("images", "labels", "groups"):
            f[f"train/{name}"].resize(0, axis=0)


START_FAULTS = {  # id: (set-up, what the line names: "run" or "data", its text)
    "read-only-disk": (lambda m, d: _read_only(m), "run", "is on a read-only file system"),
    "unwritable-folder": (lambda m, d: _not_writable(m, d.parent.parent), "run",
                          "is not writable"),
    "empty-training-split": (_empty_train_split, "data",
                             "the training split 'train' is empty"),
}


@pytest.mark.parametrize("case", START_FAULTS, ids=list(START_FAULTS))
def test_a_run_that_cannot_start_says_why_and_names_the_file(toy_copy, tmp_path,
                                                            monkeypatch, case):
    set_up, named, text = START_FAULTS[case]
    set_up(monkeypatch, toy_copy)
    run = tmp_path / "run"
    line = assert_refused(invoke(lenet_args(toy_copy, run)),
                          run if named == "run" else toy_copy, text=text, absent=[run])
    assert "MiB free" not in line


@pytest.mark.parametrize("train_labels, text", [
    ([0] * 16, "the training rows hold one class only (a) of the 3 in the file: the model "
     "learns nothing that tells classes apart and will call every image a"),
    ([0, 1] * 8, "the training rows hold no sample of c: the model cannot learn to predict it"),
], ids=["one-class", "a-class-missing"])
def test_training_rows_lacking_classes_are_warned_about(tmp_path, caplog, train_labels, text):
    import numpy as np

    from capsmed.data.writer import DatasetWriter
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train

    rng = np.random.default_rng(0)
    data = tmp_path / "three.h5"
    with DatasetWriter(data, dataset="three", kind="folder", domain="generic",
                       class_names=["a", "b", "c"],
                       image_shape=(1, 28, 28), preprocessing={}, source={}) as w:
        for split, labels in (("train", train_labels), ("val", [0, 1, 2] * 2)):
            w.append(split, rng.integers(0, 256, (len(labels), 1, 28, 28), dtype=np.uint8),
                     np.array(labels), [f"{split}{i}" for i in range(len(labels))])
    with caplog.at_level("WARNING", logger="capsmed"):
        train(TrainConfig(data=str(data), arch="lenet", epochs=1, batch_size=8,
                          model_kwargs={"widths": [3, 4], "hidden": [8]},
                          out=str(tmp_path / "run")), disable_progress=True)
    assert f"{data}: {text}" in caplog.text
