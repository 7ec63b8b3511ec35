"""The trainer's recoverability and options: resume == uninterrupted, Ctrl-C, NaN stop,
cross-validation folds, per-class limits, routing entropy, precision, channels-last."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.challenges import cv_partition, limit_per_class_over_folds
from capsmed.data.contract import DatasetWriter, load_split
from capsmed.errors import CapsmedError
from capsmed.train.config import TrainConfig
from capsmed.train.engine import resume, train
from capsmed.train.loop import TrainingInterrupted
from capsmed.train.run import hold_run_lock
from capsmed.train.step import TrainStep
from tests.helpers import TINY_CAPSNET, assert_clean_failure

TINY_LENET = {"widths": [3, 4], "hidden": [8]}


def _cfg(data, out, **options):
    base = {"data": str(data), "arch": "capsnet", "epochs": 3, "batch_size": 8, "seed": 2,
            "out": str(out), "model_kwargs": TINY_CAPSNET, "augment": True,
            "sampler": "balanced", "steps_per_epoch": 4, "patience": None}
    return TrainConfig(**{**base, **options})


def _metrics(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in ("seconds", "images_per_s")}
            for x in lines]


def _same_weights(a, b):
    wa = load_file(str(a / "checkpoint.safetensors"))
    wb = load_file(str(b / "checkpoint.safetensors"))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("stop_at", [6, 8])  # mid-epoch, and exactly at an epoch end
def test_resume_equals_uninterrupted_run(tiny_h5, tmp_path, stop_at):
    whole = train(_cfg(tiny_h5, tmp_path / "whole"), disable_progress=True)
    with pytest.raises(TrainingInterrupted, match="--resume"):
        train(_cfg(tiny_h5, tmp_path / "cut"), disable_progress=True, stop_after_steps=stop_at)
    cut = tmp_path / "cut"
    assert (cut / "resume.pt").is_file()
    assert len(_metrics(cut)) == stop_at // 4  # finished epochs only
    resumed = resume(cut, disable_progress=True)
    assert _metrics(resumed) == _metrics(whole)
    assert _same_weights(resumed, whole)
    assert not (resumed / "resume.pt").exists()  # finished runs leave no state behind
    with pytest.raises(CapsmedError, match="nothing to resume"):
        resume(resumed)


def test_resume_refuses_edited_rows_and_an_older_protocol_revision(tiny_h5, tmp_path):
    import yaml

    cut = tmp_path / "cut"
    with pytest.raises(TrainingInterrupted):
        train(_cfg(tiny_h5, cut, fraction=0.5), disable_progress=True, stop_after_steps=6)
    config_path = cut / "config.yaml"
    original = config_path.read_text()
    config = yaml.safe_load(original)
    config["train"]["fraction"] = 0.9  # edited by hand between the two sessions
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    def refused(text):
        """The CLI says so in one line naming the file, and the run is left as it was."""
        before = {f.name: f.read_bytes() for f in cut.iterdir() if f.name != "config.yaml"}
        result = CliRunner().invoke(app, ["train", "--resume", str(cut)])
        assert_clean_failure(result, text)
        assert {f.name: f.read_bytes() for f in cut.iterdir()
                if f.name != "config.yaml"} == before

    refused(f"{cut / 'train_indices.npy'}: the run trained on other rows than its "
            "config.yaml selects now")
    config = yaml.safe_load(original)
    config["train"]["arch"] = "lenet"  # its model options are capsnet's
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    refused(f"{config_path}: ")
    config = yaml.safe_load(original)
    del config["environment"]["protocol_revision"]  # started by an older capsmed
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    refused(f"{config_path}: the run was started by a capsmed of protocol revision 0")
    config_path.write_text(original)
    held = hold_run_lock(cut)  # as another process training it right now
    refused(f"{cut}: is being trained by another process")
    os.close(held)
    assert (resume(cut, disable_progress=True) / "summary.json").is_file()


def test_resume_refuses_options_edited_in_config_yaml_but_where_it_runs(tiny_h5, tmp_path):
    """An edited lr was overridden by the optimiser's saved state, an edited batch size
    or routing iterations trained the rest of the run otherwise than its start, all
    while config.yaml claimed the edited values."""
    import yaml

    cut = tmp_path / "cut"
    with pytest.raises(TrainingInterrupted):
        train(_cfg(tiny_h5, cut, augment=False, sampler="shuffle"), disable_progress=True,
              stop_after_steps=6)
    config_path = cut / "config.yaml"
    original = config_path.read_text()
    before = {f.name: f.read_bytes() for f in cut.iterdir() if f.name != "config.yaml"}
    for section, key, value, text in (
            ("train", "lr", 0.5, "lr 0.0001 -> 0.5"),
            ("train", "batch_size", 4, "batch_size 8 -> 4"),
            ("model_kwargs", "routing_iters", 1, "model_kwargs.routing_iters null -> 1")):
        config = yaml.safe_load(original)
        config[section][key] = value
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        result = CliRunner().invoke(app, ["train", "--resume", str(cut)])
        assert_clean_failure(result, f"{config_path}: options edited since the run "
                             f"started ({text})")
        assert {f.name: f.read_bytes() for f in cut.iterdir()
                if f.name != "config.yaml"} == before
    config = yaml.safe_load(original)  # where it runs may change: another machine
    config["train"].update(device="cpu", loader_workers=0, eval_batch_size=3)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert (resume(cut, disable_progress=True) / "summary.json").is_file()


def test_ctrl_c_saves_a_resumable_state(tiny_h5, tmp_path, monkeypatch):
    whole = train(_cfg(tiny_h5, tmp_path / "whole", epochs=2), disable_progress=True)
    calls = {"n": 0}
    original = TrainStep.__call__

    def interrupting(self, x, y, *share):
        calls["n"] += 1
        if calls["n"] == 3:  # as if the user pressed Ctrl-C during step 3
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, x, y, *share)

    monkeypatch.setattr(TrainStep, "__call__", interrupting)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when started in the background
    with pytest.raises(TrainingInterrupted, match="SIGINT"):
        train(_cfg(tiny_h5, tmp_path / "cut", epochs=2), disable_progress=True)
    monkeypatch.setattr(TrainStep, "__call__", original)
    assert signal.getsignal(signal.SIGINT) == before  # the handler is restored
    resumed = resume(tmp_path / "cut", disable_progress=True)
    assert _metrics(resumed) == _metrics(whole) and _same_weights(resumed, whole)


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(
        tiny_h5, tmp_path, monkeypatch):
    import capsmed.train.step as step_module

    calls = {"n": 0}
    real_loss = step_module.training_loss

    def poisoned(*args, **kwargs):
        loss = real_loss(*args, **kwargs)
        if not torch.is_grad_enabled():  # validation: left alone
            return loss
        calls["n"] += 1
        return loss * float("nan") if calls["n"] == 6 else loss

    monkeypatch.setattr(step_module, "training_loss", poisoned)
    with pytest.raises(CapsmedError, match="NaN/inf at step 6 \\(epoch 2\\)"):
        train(_cfg(tiny_h5, tmp_path / "nan", augment=False), disable_progress=True)
    kept = json.loads((tmp_path / "nan" / "checkpoint.json").read_text())
    assert kept["epoch"] == 1
    weights = load_file(str(tmp_path / "nan" / "checkpoint.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())


def _folds_file(tiny_h5, path, k=3):
    """tiny_h5's train+val+test as one 'all' split with k folds by case."""
    parts = [load_split(tiny_h5, s) for s in ("train", "val", "test")]
    images = np.concatenate([p.images for p in parts])
    labels = np.concatenate([p.labels for p in parts])
    groups = np.concatenate([p.groups for p in parts])
    cases = sorted(set(groups))
    folds = np.array([cases.index(g) % k for g in groups])
    with DatasetWriter(path, dataset="toy-cv", kind="folder", domain="generic",
                       class_names=["non-mitosis", "mitosis"],
                       image_shape=images.shape[1:], preprocessing={}, source={}) as w:
        w.append("all", images, labels, groups, folds=folds)
    return path, labels, folds


def test_cross_validation_fold_trains_on_the_others_and_evaluates_the_held_out_fold(
        tiny_h5, tmp_path):
    path, labels, folds = _folds_file(tiny_h5, tmp_path / "cv.h5")
    cfg = TrainConfig(data=str(path), arch="lenet", epochs=1, batch_size=16, fold=1, folds=3,
                      out=str(tmp_path / "f1"), model_kwargs=TINY_LENET)
    run = train(cfg, disable_progress=True)
    train_rows = np.load(run / "train_indices.npy")
    test_rows = np.load(run / "test_indices.npy")
    assert set(train_rows) == set(np.flatnonzero(folds != 1))
    assert set(test_rows) == set(np.flatnonzero(folds == 1))
    # the file's number of folds is recorded: a run without --folds is the same protocol
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["dataset"]["folds"] == 3
    result = CliRunner().invoke(app, ["-q", "evaluate", str(run)])
    assert result.exit_code == 0, result.output
    report = json.loads((run / "report" / "report.json").read_text())
    assert report["samples"] == len(test_rows)
    # another file with folds: the fold's row numbers mean nothing there, so 'test' is
    # that file's own split (it has none), and --split all scores the whole file
    other, _, _ = _folds_file(tiny_h5, tmp_path / "other.h5", k=2)
    result = CliRunner().invoke(app, ["-q", "evaluate", str(run), "--data", str(other),
                                      "--report-name", "other", "--no-grids"])
    assert result.exit_code == 1 and "has no 'test' split" in result.stderr
    result = CliRunner().invoke(app, ["-q", "evaluate", str(run), "--data", str(other),
                                      "--report-name", "other", "--no-grids", "--split", "all"])
    assert result.exit_code == 0, result.output
    assert json.loads((run / "other" / "report.json").read_text())["samples"] == len(labels)
    (run / "test_indices.npy").write_bytes((run / "train_indices.npy").read_bytes())
    earlier = (run / "report" / "report.json").read_bytes()
    result = CliRunner().invoke(app, ["-q", "evaluate", str(run), "--no-grids"])
    assert_clean_failure(result, f"{run / 'test_indices.npy'}: {len(train_rows)} of its")
    assert "are training rows of the run" in result.stderr
    assert (run / "report" / "report.json").read_bytes() == earlier  # left as it was
    with pytest.raises(CapsmedError, match="has 3 folds, not --folds 5"):
        train(TrainConfig(**{**cfg.to_dict(), "folds": 5, "out": str(tmp_path / "x")}))
    with pytest.raises(CapsmedError, match="has no 'train' split.*--fold"):
        train(TrainConfig(data=str(path), arch="lenet", out=str(tmp_path / "y")))
    with pytest.raises(CapsmedError, match="needs a file written with cross-validation"):
        train(TrainConfig(data=str(tiny_h5), arch="lenet", fold=0, out=str(tmp_path / "z")))
    assert not (tmp_path / "x").exists() and not (tmp_path / "z").exists()


def test_a_fold_run_records_the_last_epoch_as_the_kept_one(tiny_h5, tmp_path):
    """No validation set: the last epoch is kept, so it is the one metrics.jsonl marks
    and summary.json reports (they named the lowest training loss instead). At this
    seed and rate the training loss rises in epoch 3, which the old record missed."""
    path, _, _ = _folds_file(tiny_h5, tmp_path / "cv.h5")
    run = train(TrainConfig(data=str(path), arch="lenet", epochs=3, batch_size=16, fold=0,
                            folds=3, lr=0.1, seed=0, out=str(tmp_path / "f0"),
                            model_kwargs=TINY_LENET), disable_progress=True)
    records = _metrics(run)
    assert [r["best"] for r in records] == [True, True, True]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_epoch"] == 3
    assert summary["best_selection_loss"] == records[-1]["train_loss"]
    assert json.loads((run / "checkpoint.json").read_text())["epoch"] == 3


def test_per_class_limit_with_folds_sends_the_rest_to_the_test_set():
    labels = np.array([0] * 50 + [1] * 8)
    folds = np.arange(58) % 5
    train_rows, test_rows = cv_partition(labels, folds, 2, per_class_limit=10, seed=0)
    limited = limit_per_class_over_folds(labels, folds, 10, seed=0)
    assert np.bincount(labels[limited]).tolist() == [10, 8]
    assert set(train_rows) | set(test_rows) == set(range(58))
    assert not set(train_rows) & set(test_rows)
    assert set(train_rows) == {i for i in limited if folds[i] != 2}
    assert np.bincount(labels[test_rows]).tolist()[0] == 40 + sum(
        1 for i in limited if folds[i] == 2 and labels[i] == 0)
    again, _ = cv_partition(labels, folds, 3, per_class_limit=10, seed=0)
    assert set(again) | set(limited) == set(limited)  # same pool for every fold


def test_a_fold_without_samples_is_refused_not_trained_on_every_row():
    """Folds 0 and 2 only: --fold 1 trained on every row and saved no test row."""
    labels = np.array([0, 1] * 4)
    folds = np.array([0, 0, 0, 0, 2, 2, 2, 2])
    with pytest.raises(CapsmedError, match="no sample of the file is in fold 1"):
        cv_partition(labels, folds, 1, per_class_limit=None, seed=0)
    with pytest.raises(CapsmedError, match="no sample of the file is in fold 1"):
        cv_partition(labels, folds, 1, per_class_limit=2, seed=0)
    train_rows, test_rows = cv_partition(labels, folds, 2, per_class_limit=None, seed=0)
    assert train_rows.tolist() == [0, 1, 2, 3] and test_rows.tolist() == [4, 5, 6, 7]


def test_per_class_limit_spreads_each_class_evenly_over_the_folds():
    """Paper 001: up to x images per class make the 5 folds, so every fold holds x/5 of
    each class; a fold short of them is made up from the others."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), [200, 60, 12, 7])
    folds = rng.permutation(np.arange(len(labels)) % 5)
    folds[(labels == 2) & (folds == 4)] = 0  # class 2 has no image in fold 4
    pool = limit_per_class_over_folds(labels, folds, 10, seed=3)
    per = np.zeros((4, 5), int)
    np.add.at(per, (labels[pool], folds[pool]), 1)
    assert per[0].tolist() == per[1].tolist() == [2] * 5
    assert per[2].sum() == 10 and per[2][4] == 0  # made up in the other folds
    assert per[3].sum() == 7  # fewer than x: all of them
    for fold in range(5):
        train_rows, _ = cv_partition(labels, folds, fold, per_class_limit=10, seed=3)
        assert np.bincount(labels[train_rows], minlength=4)[:2].tolist() == [8, 8]


def test_per_class_limit_without_folds_caps_the_training_samples(tiny_h5, tmp_path):
    run = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                            per_class_limit=5, out=str(tmp_path / "lim"),
                            model_kwargs=TINY_LENET), disable_progress=True)
    full = load_split(tiny_h5, "train")
    chosen = np.load(run / "train_indices.npy")
    assert np.bincount(full.labels[chosen]).tolist() == [5, 5]
    # one pass over the 10 kept (it trained as many steps as the whole split, which the
    # same limit with folds did not); a fraction on top: one pass over the limited set
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps_per_epoch"] == 1 and summary["train_samples_full"] == 10
    half = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=4,
                             per_class_limit=5, fraction=0.5, out=str(tmp_path / "half"),
                             model_kwargs=TINY_LENET), disable_progress=True)
    assert json.loads((half / "summary.json").read_text())["steps_per_epoch"] == 3


def test_routing_entropy_is_logged_for_capsule_networks_only(tiny_h5, tmp_path):
    caps = train(_cfg(tiny_h5, tmp_path / "caps", epochs=1), disable_progress=True)
    entropy = _metrics(caps)[0]["routing_entropy"]
    assert 0.0 < entropy <= np.log(2) + 1e-6  # two class capsules: at most log 2 nats
    lenet = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                              out=str(tmp_path / "lenet"), model_kwargs=TINY_LENET),
                  disable_progress=True)
    assert "routing_entropy" not in _metrics(lenet)[0]


def test_a_recon_weight_given_to_a_model_without_decoder_is_warned_about(tiny_h5, tmp_path,
                                                                         caplog):
    """LeNet trained with --recon-weight 0.01 said nothing: config.yaml recorded a weight
    no loss used. (Warned, not refused: gu2021.yaml gives its ConvNets the study's.)"""
    caplog.set_level("WARNING", logger="capsmed")
    lenet = {"data": str(tiny_h5), "arch": "lenet", "epochs": 1, "batch_size": 16,
             "model_kwargs": TINY_LENET}
    train(TrainConfig(**lenet, out=str(tmp_path / "given"), recon_weight=0.01),
          disable_progress=True)
    said = [r.getMessage() for r in caplog.records if "recon_weight" in r.getMessage()]
    assert said == ["recon_weight 0.01 has no effect on lenet: it has no reconstruction "
                    "decoder (config.yaml records the weight all the same)"]
    caplog.clear()
    train(TrainConfig(**lenet, out=str(tmp_path / "default")), disable_progress=True)
    train(_cfg(tiny_h5, tmp_path / "caps", epochs=1, recon_weight=0.01), disable_progress=True)
    assert not [r for r in caplog.records if "recon_weight" in r.getMessage()]


def _two_label_file(path, size: int, splits: dict[str, int], sources: bool = False):
    """A tiny MultiMNIST-like file of 3 classes (``sources``: with both digits' images)."""
    rng = np.random.default_rng(0)
    with DatasetWriter(path, dataset="multimnist", kind="multimnist", domain="digits",
                       class_names=["0", "1", "2"], image_shape=(1, size, size),
                       preprocessing={}, source={}) as w:
        for split, n in splits.items():
            first = np.arange(n) % 3
            pixels = [rng.integers(0, 255, (n, 1, size, size), dtype=np.uint8)
                      for _ in range(3 if sources else 1)]
            meta = {"label2": (first + 1) % 3}
            if sources:
                meta |= {"image_a": pixels[1], "image_b": pixels[2]}
            w.append(split, pixels[0], first, np.array([f"{split}{i}" for i in range(n)]),
                     meta=meta)
    return path


def test_two_labels_with_a_loss_they_cannot_use_are_refused_before_the_folder(tmp_path):
    """A spread-loss model on a two-label file failed at its first step, leaving a run
    folder (config.yaml, resume.pt) that neither a rerun nor --resume could use."""
    path = _two_label_file(tmp_path / "two.h5", 20, {"train": 12, "val": 6})
    out = tmp_path / "run"
    with pytest.raises(CapsmedError, match="two-label training .* supports margin and ce "
                       "losses; capsnet trains with the spread loss"):
        train(TrainConfig(data=str(path), arch="capsnet", epochs=1, batch_size=6,
                          out=str(out), model_kwargs={**TINY_CAPSNET, "loss": "spread"}),
              disable_progress=True)
    assert not out.exists()


@pytest.mark.parametrize("option", [{"imbalance": {"0": 20}}, {"per_class_limit": 2}])
def test_two_labels_refuse_class_counts_of_the_first_object_only(tmp_path, option):
    """--imbalance 0=20 kept rows by their first digit: class 0 stayed as the second
    digit of most rows (60% of its objects, not 20%), without a word."""
    path = _two_label_file(tmp_path / "two.h5", 12, {"train": 30, "val": 3})
    out = tmp_path / "run"
    with pytest.raises(CapsmedError, match=f"does not support --{next(iter(option))}"
                       .replace("_", "-")):
        train(TrainConfig(data=str(path), arch="lenet", epochs=1, batch_size=6, out=str(out),
                          model_kwargs=TINY_LENET, **option), disable_progress=True)
    assert not out.exists()


def test_two_labels_with_an_unmasked_decoder_reconstruct_the_whole_input(tmp_path):
    """reconstruction=plain (paper 004's "normal" reconstruction, a Table 4 row of
    pipelines/gu2021.yaml on MultiMNIST) makes one image from every capsule: it is
    scored against the input, both objects, not refused (the shipped pipeline's runs
    failed) nor against each object in turn (it learnt their average)."""
    import capsmed.train.losses as losses
    from capsmed.data.loader import TwoLabels
    from capsmed.models.common import ModelOutput

    path = _two_label_file(tmp_path / "two.h5", 20, {"train": 12, "val": 6}, sources=True)
    done = train(TrainConfig(data=str(path), arch="capsnet", epochs=1, batch_size=6,
                             out=str(tmp_path / "run"),
                             model_kwargs={**TINY_CAPSNET, "reconstruction": "plain"}),
                 disable_progress=True)
    assert (done / "summary.json").is_file()

    class Decoder(torch.nn.Module):  # the second object's reconstruction: image b
        def __init__(self, conditional: bool) -> None:
            super().__init__()
            self.conditional = conditional

        def forward(self, capsules, keep):
            return b

    x, a, b = torch.rand(3, 2, 1, 4, 4)
    plain, masked = Decoder(False), Decoder(True)
    out = ModelOutput(scores=torch.full((2, 3), 0.5), reconstruction=x.clone(),
                      capsules=torch.zeros(2, 3, 2))
    target = TwoLabels(torch.tensor([0, 1]), torch.tensor([1, 2]), a, b)
    no_recon = losses.two_label_loss("margin", out, target, 0.0, plain, images=x)
    # the input reconstructed exactly: nothing added, whatever the objects' images
    assert losses.two_label_loss("margin", out, target, 1.0, plain, images=x) == no_recon
    assert losses.two_label_loss("margin", out, target, 1.0, masked, images=x) > no_recon


def test_two_labels_of_one_class_are_refused(tmp_path):
    """label2 equal to the label (MultiMNIST never pairs a class with itself) trained
    one target, and top-2 accuracy counted the image right whatever its other class."""
    import h5py

    path = _two_label_file(tmp_path / "two.h5", 12, {"train": 12, "val": 6})
    with h5py.File(path, "r+") as f:
        f["train/meta/label2"][3] = f["train/labels"][3]
    out = tmp_path / "run"
    with pytest.raises(CapsmedError, match="split 'train' has 1 image\\(s\\) whose two labels "
                       "\\(labels, meta/label2\\) are the same class"):
        train(TrainConfig(data=str(path), arch="lenet", epochs=1, batch_size=6, out=str(out),
                          model_kwargs=TINY_LENET), disable_progress=True)
    assert not out.exists()


def _two_label_variant(path, val_label2: bool = True, source_shape=None):
    """A 3-class two-label file of 12x12 images: 'val' without meta/label2, or
    meta/image_a and image_b of ``source_shape`` per sample."""
    rng = np.random.default_rng(0)
    with DatasetWriter(path, dataset="multimnist", kind="multimnist", domain="digits",
                       class_names=["0", "1", "2"], image_shape=(1, 12, 12),
                       preprocessing={}, source={}) as w:
        for split, n in (("train", 6), ("val", 3)):
            first = np.arange(n) % 3
            meta = {"label2": (first + 1) % 3} if split == "train" or val_label2 else {}
            if source_shape is not None:
                meta |= {k: rng.integers(0, 255, (n, *source_shape), dtype=np.uint8)
                         for k in ("image_a", "image_b")}
            w.append(split, rng.integers(0, 255, (n, 1, 12, 12), dtype=np.uint8), first,
                     np.array([f"{split}{i}" for i in range(n)]), meta=meta)
    return path


def test_two_labels_refuse_a_validation_split_of_one_label(tmp_path):
    """Training on both digits but validating on the first only (a 'val' without
    meta/label2) chose the checkpoint on another task than the one trained, unsaid."""
    path = _two_label_variant(tmp_path / "two.h5", val_label2=False)
    out = tmp_path / "run"
    with pytest.raises(CapsmedError, match="'train' holds two labels per image .* but "
                       "'val' one"):
        train(TrainConfig(data=str(path), arch="lenet", epochs=1, batch_size=6,
                          out=str(out), model_kwargs=TINY_LENET), disable_progress=True)
    assert not out.exists()


def test_two_labels_refuse_source_images_of_another_shape(tmp_path):
    """meta/image_a stored [N, H, W] (no channel axis) broadcast against the [N, 1, H, W]
    reconstruction: every digit was compared with every source image of the batch."""
    path = _two_label_variant(tmp_path / "two.h5", source_shape=(12, 12))
    out = tmp_path / "run"
    with pytest.raises(CapsmedError, match=r"'train/meta/image_a' must be uint8 \[6, 1, 12, "
                       r"12\] like 'train/images' .* got uint8 \[6, 12, 12\]"):
        train(TrainConfig(data=str(path), arch="convnet-cr", epochs=1, batch_size=6,
                          out=str(out), model_kwargs={"conv_channels": 8, "kernel_size": 3,
                                                      "decoder_hidden": [8]}),
              disable_progress=True)
    assert not out.exists()
    fine = _two_label_variant(tmp_path / "fine.h5", source_shape=(1, 12, 12))
    train(TrainConfig(data=str(fine), arch="convnet-cr", epochs=1, batch_size=6,
                      out=str(out), model_kwargs={"conv_channels": 8, "kernel_size": 3,
                                                  "decoder_hidden": [8]}),
          disable_progress=True)


def test_two_labels_reconstruct_the_second_object_under_bf16_autocast(tmp_path):
    """The second object's reconstruction runs after the forward pass, outside its
    autocast: a ConvNet-CR's bf16 capsules met the fp32 decoder and every step failed
    (bf16 is what --precision auto picks on a GPU)."""
    path = _two_label_file(tmp_path / "two.h5", 12, {"train": 6, "val": 3}, sources=True)
    run = train(TrainConfig(data=str(path), arch="convnet-cr", epochs=1, batch_size=6,
                            out=str(tmp_path / "run"), precision="bf16",
                            model_kwargs={"conv_channels": 8, "kernel_size": 3,
                                          "decoder_hidden": [8]}), disable_progress=True)
    assert np.isfinite(_metrics(run)[0]["train_loss"])


def test_bf16_autocast_and_channels_last_train_on_cpu(tiny_h5, tmp_path):
    run = train(_cfg(tiny_h5, tmp_path / "bf16", epochs=1, precision="bf16",
                     channels_last=True), disable_progress=True)
    record = _metrics(run)[0]
    assert np.isfinite(record["train_loss"]) and np.isfinite(record["val_loss"])
    config = (run / "config.yaml").read_text()
    assert "bfloat16" in config


def test_streaming_from_hdf5_gives_the_same_run_as_holding_the_data(tiny_h5, tmp_path):
    a = train(_cfg(tiny_h5, tmp_path / "mem", epochs=1, data_loading="memory"),
              disable_progress=True)
    b = train(_cfg(tiny_h5, tmp_path / "stream", epochs=1, data_loading="stream",
                   loader_workers=0), disable_progress=True)
    assert _metrics(a) == _metrics(b) and _same_weights(a, b)


def test_streaming_batches_leave_the_global_random_state_alone(tiny_h5):
    """A DataLoader draws its workers' seed from torch's global generator unless given
    its own: a resumed epoch builds a new loader, so every later dropout mask shifted."""
    from capsmed.data.contract import read_labels
    from capsmed.data.loader import StreamingSplit

    labels, _ = read_labels(tiny_h5, "train")
    split = StreamingSplit(tiny_h5, "train", np.arange(len(labels)), labels,
                           torch.device("cpu"), workers=0)
    before = torch.get_rng_state()
    batches = list(split.batches([torch.arange(4), torch.arange(4, 8)]))
    assert len(batches) == 2 and torch.equal(before, torch.get_rng_state())


def test_sigterm_to_the_process_group_stops_a_streaming_run_resumably(
        tiny_h5, tmp_path, monkeypatch):
    """Slurm's preemption and ``kill -TERM -PGID`` signal the reader processes too: a
    reader that died of it failed the run with a DataLoader error, its state unsaved
    since the start, instead of stopping it as SIGTERM to the trainer alone does."""
    import multiprocessing

    options = {"epochs": 2, "data_loading": "stream", "loader_workers": 1}
    whole = train(_cfg(tiny_h5, tmp_path / "whole", **options), disable_progress=True)
    calls = {"n": 0}
    original = TrainStep.__call__

    def terminating(self, x, y, *share):
        calls["n"] += 1
        if calls["n"] == 3:  # the whole group: the readers, then this process
            readers = multiprocessing.active_children()
            assert readers
            # sent by another process: torch lets a reader end quietly on its parent's
            subprocess.run(["kill", "-TERM", *(str(r.pid) for r in readers)], check=True)
            for reader in readers:
                reader.join(0.5)
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, x, y, *share)

    monkeypatch.setattr(TrainStep, "__call__", terminating)
    with pytest.raises(TrainingInterrupted, match="SIGTERM"):
        train(_cfg(tiny_h5, tmp_path / "cut", **options), disable_progress=True)
    monkeypatch.setattr(TrainStep, "__call__", original)
    resumed = resume(tmp_path / "cut", disable_progress=True)
    assert _metrics(resumed) == _metrics(whole) and _same_weights(resumed, whole)


def test_cli_resume_refuses_other_options(tmp_path):
    result = CliRunner().invoke(app, ["train", "--resume", str(tmp_path), "--epochs", "3"])
    assert result.exit_code == 1 and "give no other training options" in result.output


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_matches_one_process(tiny_h5, tmp_path):
    """torchrun + gloo: each rank trains on half of every global batch; the averaged
    gradients make the run follow the single-process one with the same batch. With
    augmentation too: each rank draws the global batch's transforms and uses its
    samples' (with one seed per rank, sample k of every rank got the same transform)."""
    import subprocess
    import sys

    options = ["--data", str(tiny_h5), "--arch", "lenet", "--epochs", "2", "--batch-size", "8",
               "--seed", "4", "--model-arg", "widths=[3,4]", "--model-arg", "hidden=[8]",
               "--device", "cpu", "--augment"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "capsmed", "-q", "train", *options, "--out", str(tmp_path / "ddp")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    single = CliRunner().invoke(app, ["-q", "train", *options, "--out", str(tmp_path / "one")])
    assert single.exit_code == 0, single.output
    ddp, one = tmp_path / "ddp", tmp_path / "one"
    assert json.loads((ddp / "summary.json").read_text())["world_size"] == 2
    a, b = _metrics(ddp), _metrics(one)
    assert [m["epoch"] for m in a] == [1, 2]
    for x, y in zip(a, b, strict=True):
        assert x["train_loss"] == pytest.approx(y["train_loss"], rel=1e-4)
        assert x["val_loss"] == pytest.approx(y["val_loss"], rel=1e-4)
    wa = load_file(str(ddp / "checkpoint.safetensors"))
    wb = load_file(str(one / "checkpoint.safetensors"))
    assert all(torch.allclose(wa[k], wb[k], atol=1e-5) for k in wa)


def test_transfer_copies_and_freezes_the_named_layers(tiny_h5, tmp_path):
    source = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                               out=str(tmp_path / "A"), model_kwargs=TINY_LENET),
                   disable_progress=True)
    a = load_file(str(source / "checkpoint.safetensors"))
    first = sorted(a)[0].split(".")[0]
    target = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                               seed=7, out=str(tmp_path / "AnB"), model_kwargs=TINY_LENET,
                               transfer_from=str(source), transfer_layers=[first]),
                   disable_progress=True)
    b = load_file(str(target / "checkpoint.safetensors"))
    for name in a:
        same = torch.equal(a[name], b[name])
        assert same == name.startswith(first + "."), name  # frozen copies; the rest trained
    with pytest.raises(CapsmedError, match="matches no parameter"):
        train(TrainConfig(data=str(tiny_h5), arch="lenet", out=str(tmp_path / "x"),
                          model_kwargs=TINY_LENET, transfer_from=str(source),
                          transfer_layers=["nope"]))
    # the copied layers see inputs scaled as their source's were, not by this run's rows
    few = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=4,
                            fraction=0.3, out=str(tmp_path / "few"), model_kwargs=TINY_LENET,
                            transfer_from=str(source), transfer_layers=[first]),
                disable_progress=True)
    meta = {r: json.loads((r / "checkpoint.json").read_text())["model_kwargs"]
            for r in (source, few)}
    assert meta[few]["input_mean"] == meta[source]["input_mean"]
    assert meta[few]["input_std"] == meta[source]["input_std"]


def test_transfer_refuses_sources_whose_layers_are_not_what_it_names(tiny_h5, tmp_path):
    """An unfinished source lent an intermediate epoch's layers, one of another
    architecture its same-named layers, a deeper block only its first convolutions, and
    --no-standardize fed a standardised source's layers unscaled inputs, all silently;
    config.yaml did not say which weights were copied."""
    fast = {"data": str(tiny_h5), "epochs": 1, "batch_size": 16, "steps_per_epoch": 1}

    def run(name, arch, kwargs, **options):
        return train(TrainConfig(**{**fast, **options}, arch=arch, out=str(tmp_path / name),
                                 model_kwargs=kwargs), disable_progress=True)

    def refused(arch, kwargs, source, match, **options):
        with pytest.raises(CapsmedError, match=match):
            run("target", arch, kwargs, transfer_from=str(source), transfer_layers=["features"],
                **options)
        assert not (tmp_path / "target").exists()

    with pytest.raises(TrainingInterrupted):  # epoch 1 of 2 kept, resumable
        train(TrainConfig(**{**fast, "epochs": 2}, arch="lenet", out=str(tmp_path / "unf"),
                          model_kwargs=TINY_LENET), disable_progress=True, stop_after_steps=1)
    refused("lenet", TINY_LENET, tmp_path / "unf", "its training has not finished")
    (tmp_path / "unf" / "resume.pt").unlink()  # deleted to save disk: still that epoch's
    refused("lenet", TINY_LENET, tmp_path / "unf", r"not finished \(no summary.json, and "
            "its resumable state was removed\\).* it cannot be resumed")
    avg = run("avg", "convnet-avg", {"channels": [4, 4], "kernel_size": 9})
    refused("convnet-cr", {"conv_channels": 4, "decoder_hidden": [16, 16]}, avg,
            "a run of architecture 'convnet-avg'")
    deep = run("deep", "baseline", {"channels": [4, 4, 4], "hidden": [8, 6]})
    refused("baseline", {"channels": [4, 4], "hidden": [8, 6]}, deep,
            "parameter 'features.4.bias' is missing")
    # its layers were trained on standardised inputs: unscaled ones are not what they saw
    refused("baseline", {"channels": [4, 4, 4], "hidden": [8, 6]}, deep,
            "standardised its inputs.*drop --no-standardize", standardize=False)
    target = run("same", "baseline", {"channels": [4, 4, 4], "hidden": [8, 6]},
                 transfer_from=str(deep), transfer_layers=["features"])
    recorded = yaml.safe_load((target / "config.yaml").read_text())["transfer"]
    source_meta = json.loads((deep / "checkpoint.json").read_text())
    assert recorded == {"run": str(deep.resolve()), "epoch": 1,
                        "weights_digest": source_meta["weights_digest"]}


def _renamed(data, path, names):
    """A copy of ``data`` whose classes are called ``names`` (same images and labels)."""
    import shutil

    import h5py

    shutil.copy(data, path)
    with h5py.File(path, "r+") as f:
        f.attrs["class_names"] = json.dumps(names)
        for split in f.values():
            split["labels"].attrs["class_names"] = json.dumps(names)
    return path


def test_the_class_layer_is_not_transferred_between_other_classes(tiny_h5, tmp_path):
    """The class layer copied from a run of other classes (or the same in another order)
    scored the source's class 0 as this run's class 0, silently; transferring every
    layer frozen left nothing to train (a traceback from the optimiser)."""
    fast = {"arch": "lenet", "epochs": 1, "batch_size": 16, "steps_per_epoch": 1,
            "model_kwargs": TINY_LENET}
    source = train(TrainConfig(data=str(tiny_h5), **fast, out=str(tmp_path / "A")),
                   disable_progress=True)
    names = json.loads((source / "checkpoint.json").read_text())["class_names"]
    swapped = _renamed(tiny_h5, tmp_path / "swapped.h5", names[::-1])
    other = _renamed(tiny_h5, tmp_path / "other.h5", ["cat", "dog"])
    for data, text in ((swapped, r"\(the same classes in another order\)"),
                       (other, r"this run's are \['cat', 'dog'\], so")):
        with pytest.raises(CapsmedError, match=r"layer 'classifier' holds its class layer "
                           rf"'classifier.3'.*{text}.*leave the class layer out of "
                           "--transfer-layers"):
            train(TrainConfig(data=str(data), **fast, out=str(tmp_path / "B"),
                              transfer_from=str(source), transfer_layers=["classifier"],
                              freeze_transferred=False), disable_progress=True)
        assert not (tmp_path / "B").exists()
    # the layers below the class layer transfer; the same classes transfer it too
    below = train(TrainConfig(data=str(other), **fast, out=str(tmp_path / "below"),
                              transfer_from=str(source),
                              transfer_layers=["features", "classifier.1"]),
                  disable_progress=True)
    assert (below / "summary.json").is_file()
    with pytest.raises(CapsmedError, match="frozen, so nothing would be trained"):
        train(TrainConfig(data=str(tiny_h5), **fast, out=str(tmp_path / "all"),
                          transfer_from=str(source), transfer_layers=["features", "classifier"]),
              disable_progress=True)
    assert not (tmp_path / "all").exists()


def test_an_interrupted_transfer_run_resumes_without_its_source(tiny_h5, tmp_path):
    """Resuming re-read the source run (its rows, its checkpoint), so a source moved
    away blocked the resume ("not a run directory") though resume.pt holds the copied
    weights; it now resumes to the same weights as an uninterrupted run."""
    fast = {"data": str(tiny_h5), "arch": "lenet", "batch_size": 16, "steps_per_epoch": 2,
            "model_kwargs": TINY_LENET}
    source = train(TrainConfig(**fast, epochs=1, out=str(tmp_path / "A")),
                   disable_progress=True)
    moved = {"epochs": 2, "transfer_from": str(source), "transfer_layers": ["features"]}
    whole = train(TrainConfig(**fast, **moved, out=str(tmp_path / "whole")),
                  disable_progress=True)
    with pytest.raises(TrainingInterrupted):
        train(TrainConfig(**fast, **moved, out=str(tmp_path / "cut")), disable_progress=True,
              stop_after_steps=3)
    source.rename(tmp_path / "elsewhere")
    cut = resume(tmp_path / "cut", disable_progress=True)
    assert _same_weights(whole, cut)
    a = load_file(str(tmp_path / "elsewhere" / "checkpoint.safetensors"))
    b = load_file(str(cut / "checkpoint.safetensors"))
    assert all(torch.equal(a[n], b[n]) for n in a if n.startswith("features."))


def test_transfer_from_a_run_trained_on_the_test_fold_is_refused(tiny_h5, tmp_path):
    """Fold 1 transferring from a fold-0 run tested on samples its copied layers were
    trained on, silently."""
    path, _, _ = _folds_file(tiny_h5, tmp_path / "cv.h5")
    fast = {"data": str(path), "arch": "lenet", "epochs": 1, "batch_size": 16,
            "steps_per_epoch": 1, "folds": 3, "model_kwargs": TINY_LENET}
    source = train(TrainConfig(**fast, fold=0, out=str(tmp_path / "f0")),
                   disable_progress=True)
    with pytest.raises(CapsmedError, match=r"f0: trained on \d+ of the rows this run tests"):
        train(TrainConfig(**fast, fold=1, out=str(tmp_path / "f1"), transfer_from=str(source),
                          transfer_layers=["features"]), disable_progress=True)
    assert not (tmp_path / "f1").exists()
    same_fold = train(TrainConfig(**fast, fold=0, seed=1, out=str(tmp_path / "again"),
                                  transfer_from=str(source), transfer_layers=["features"]),
                      disable_progress=True)
    assert (same_fold / "summary.json").is_file()


def test_weights_made_nan_by_the_last_update_are_not_kept(tiny_h5, tmp_path, monkeypatch):
    """A finite loss whose gradient is not finite turns the weights NaN with no NaN loss
    to see: a fold run (no validation) kept them as its checkpoint and finished."""
    path, _, _ = _folds_file(tiny_h5, tmp_path / "cv.h5")
    original, calls = TrainStep.__call__, {"n": 0}

    def inf_gradient_at_the_last_step(self, x, y, *share):
        calls["n"] += 1
        if calls["n"] == 6:  # the last step of epoch 2
            hook = next(self.model.parameters()).register_hook(
                lambda g: torch.full_like(g, float("inf")))
            try:
                return original(self, x, y, *share)
            finally:
                hook.remove()
        return original(self, x, y, *share)

    monkeypatch.setattr(TrainStep, "__call__", inf_gradient_at_the_last_step)
    run = tmp_path / "f0"
    with pytest.raises(CapsmedError, match="weights became NaN/inf in the last step of "
                                           "epoch 2.*checkpoint of epoch 1 "):
        train(TrainConfig(data=str(path), arch="lenet", epochs=2, batch_size=16, fold=0,
                          folds=3, steps_per_epoch=3, out=str(run), model_kwargs=TINY_LENET),
              disable_progress=True)
    assert not (run / "summary.json").exists()
    weights = load_file(str(run / "checkpoint.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())
