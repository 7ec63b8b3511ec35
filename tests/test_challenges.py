"""Paper 000's data-challenge protocols, the samplers and the optimisation options."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from capsmed.data.challenges import DataChallenge, parse_imbalance, select_training_indices
from capsmed.data.contract import load_split
from capsmed.errors import CapsmedError
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train
from capsmed.train.sampling import BatchSampler

LABELS = np.array([0] * 600 + [1] * 400)
NAMES = ["healthy", "lesion"]


def test_fraction_keeps_class_ratios_and_is_seeded():
    idx = select_training_indices(LABELS, NAMES, DataChallenge(fraction=0.1), seed=3)
    assert np.bincount(LABELS[idx]).tolist() == [60, 40]
    assert np.array_equal(idx, np.unique(idx))  # sorted, no repeats
    again = select_training_indices(LABELS, NAMES, DataChallenge(fraction=0.1), seed=3)
    other = select_training_indices(LABELS, NAMES, DataChallenge(fraction=0.1), seed=4)
    assert np.array_equal(idx, again) and not np.array_equal(idx, other)
    tiny = select_training_indices(LABELS, NAMES, DataChallenge(fraction=0.001), seed=0)
    assert np.bincount(LABELS[tiny]).tolist() == [1, 1]  # every class keeps a sample


def test_imbalance_reduces_named_classes_and_composes_with_fraction():
    idx = select_training_indices(LABELS, NAMES, DataChallenge(imbalance={"lesion": 20}), 0)
    assert np.bincount(LABELS[idx]).tolist() == [600, 80]
    both = select_training_indices(LABELS, NAMES,
                                   DataChallenge(fraction=0.5, imbalance={"lesion": 20}), 0)
    assert np.bincount(LABELS[both]).tolist() == [300, 40]
    assert DataChallenge().is_full and not DataChallenge(fraction=0.5).is_full
    with pytest.raises(CapsmedError, match="unknown class"):
        select_training_indices(LABELS, NAMES, DataChallenge(imbalance={"tumour": 20}), 0)


@pytest.mark.parametrize("bad, message", [
    (lambda: DataChallenge(fraction=0.0), "within \\(0, 1\\]"),
    (lambda: DataChallenge(imbalance={"lesion": 120}), "within \\(0, 100\\]"),
    (lambda: parse_imbalance("lesion"), "CLASS=PERCENT"),
    (lambda: parse_imbalance("lesion=lots"), "CLASS=PERCENT"),
])
def test_protocol_errors(bad, message):
    with pytest.raises(CapsmedError, match=message):
        bad()


def test_parse_imbalance_accepts_class_names_with_dashes():
    assert parse_imbalance("non-mitosis=20, mitosis=50") == {"non-mitosis": 20.0,
                                                             "mitosis": 50.0}


def _sampler(mode, steps, batch=10):
    labels = torch.tensor(LABELS[:50].tolist() + [1] * 20)  # 50 of class 0, 20 of class 1
    return BatchSampler(labels, batch, mode, steps, torch.Generator().manual_seed(0)), labels


def test_shuffle_sampler_one_pass_and_fixed_steps():
    sampler, labels = _sampler("shuffle", None)
    seen = torch.cat(list(sampler))
    assert len(sampler) == 7 and sorted(seen.tolist()) == list(range(70))
    sampler, _ = _sampler("shuffle", 20)
    batches = list(sampler)
    assert len(batches) == 20 and all(len(b) == 10 for b in batches)
    counts = torch.bincount(torch.cat(batches), minlength=70)
    assert counts.min() >= 2 and counts.max() <= 3  # 200 draws cycle ~3 passes evenly


def test_balanced_sampler_gives_every_class_equally_per_batch():
    sampler, labels = _sampler("balanced", 8)
    for batch in sampler:
        assert torch.bincount(labels[batch], minlength=2).tolist() == [5, 5]
    assert len(_sampler("balanced", None)[0]) == 7  # one pass worth of samples


def _run(tiny_h5, tmp_path, name, **options):
    cfg = TrainConfig(data=str(tiny_h5), arch="lenet", epochs=3, batch_size=8, seed=1,
                      out=str(tmp_path / name), model_kwargs={"widths": [3, 4],
                                                             "hidden": [8]}, **options)
    run = train(cfg, disable_progress=True)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return run, metrics, json.loads((run / "summary.json").read_text())


def test_fraction_run_records_its_subset_and_trains_as_many_steps(tiny_h5, tmp_path):
    full = load_split(tiny_h5, "train")
    run, _, summary = _run(tiny_h5, tmp_path, "frac", fraction=0.5)
    chosen = np.load(run / "train_indices.npy", allow_pickle=False)
    counts = np.bincount(full.labels[chosen], minlength=2)
    assert counts.tolist() == [max(1, round(0.5 * c)) for c in np.bincount(full.labels)]
    assert summary["train_samples"] == len(chosen) < summary["train_samples_full"]
    assert summary["steps_per_epoch"] == -(-len(full) // 8)  # the full split's steps
    _, _, plain = _run(tiny_h5, tmp_path, "plain")
    assert plain["steps_per_epoch"] == summary["steps_per_epoch"]


def test_early_stopping_and_schedules(tiny_h5, tmp_path):
    # with an lr far below float resolution the weights never change, so the
    # validation loss never improves after epoch 1 and patience 1 stops at epoch 2
    _, metrics, summary = _run(tiny_h5, tmp_path, "stop", lr=1e-30, patience=1)
    assert [m["epoch"] for m in metrics] == [1, 2]
    assert summary["stopped_early"] and summary["best_epoch"] == 1
    _, metrics, _ = _run(tiny_h5, tmp_path, "sched", optimizer="nadam", lr=1e-3,
                         lr_schedule="exponential", lr_decay=0.5, patience=None)
    assert [m["lr"] for m in metrics] == pytest.approx([1e-3, 5e-4, 2.5e-4])
    _, metrics, summary = _run(tiny_h5, tmp_path, "bal", sampler="balanced",
                               steps_per_epoch=4, patience=None)
    assert summary["steps_per_epoch"] == 4 and len(metrics) == 3


@pytest.mark.parametrize("option, value, message", [
    ("sampler", "weighted", "sampler must be one of"),
    ("optimizer", "sgd", "optimizer must be one of"),
    ("patience", 0, "patience must be >= 1"),
    ("fraction", 1.5, "within \\(0, 1\\]"),
])
def test_train_config_rejects_bad_options(option, value, message):
    with pytest.raises(CapsmedError, match=message):
        TrainConfig(data="x.h5", arch="lenet", **{option: value})


def test_same_seed_gives_bit_identical_cpu_runs(tiny_h5, tmp_path):
    from safetensors.torch import load_file

    options = {"fraction": 0.5, "augment": True, "sampler": "balanced", "patience": None}
    a, metrics_a, _ = _run(tiny_h5, tmp_path, "a", **options)
    b, metrics_b, _ = _run(tiny_h5, tmp_path, "b", **options)
    strip = [{k: v for k, v in m.items() if k not in ("seconds", "images_per_s")}
             for m in metrics_a]
    assert strip == [{k: v for k, v in m.items() if k not in ("seconds", "images_per_s")}
                     for m in metrics_b]
    wa = load_file(str(a / "checkpoint.safetensors"))
    wb = load_file(str(b / "checkpoint.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    c, metrics_c, _ = _run(tiny_h5, tmp_path, "c", **{**options, "augment": False})
    assert metrics_c[0]["train_loss"] != metrics_a[0]["train_loss"]


def test_balanced_class_weights_and_weighted_losses():
    from capsmed.models.common import ModelOutput
    from capsmed.train.losses import balanced_class_weights, margin_loss, training_loss

    labels = torch.tensor([0, 0, 0, 1])
    w = balanced_class_weights(labels, 3)
    assert w.tolist() == pytest.approx([4 / 6, 2.0, 1.0])  # absent class: 1
    lengths = torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.5, 0.0]])
    target = torch.tensor([0, 1])
    per_sample = (0.9 - 0.5) ** 2  # both samples: present term only
    assert margin_loss(lengths, target, class_weights=w).item() == pytest.approx(
        (per_sample * 4 / 6 + per_sample * 2.0) / 2)
    out = ModelOutput(scores=torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0]]))
    x = torch.zeros(2, 1, 2, 2)
    ce = torch.nn.functional.cross_entropy(out.scores, target, reduction="none")
    assert training_loss("ce", out, x, target, 0.0, w).item() == pytest.approx(
        ((ce * w[target]).mean()).item())


def test_class_weighted_training_under_imbalance(tiny_h5, tmp_path):
    common = {"imbalance": {"mitosis": 30}, "patience": None}
    _, plain, _ = _run(tiny_h5, tmp_path, "plain-w", **common)
    _, weighted, _ = _run(tiny_h5, tmp_path, "weighted", class_weights="balanced", **common)
    assert weighted[0]["train_loss"] != plain[0]["train_loss"]
    with pytest.raises(CapsmedError, match="class_weights must be 'balanced'"):
        TrainConfig(data="x.h5", arch="lenet", class_weights="inverse")


def test_full_disk_fails_at_start(tiny_h5, tmp_path, monkeypatch):
    import shutil as shutil_module
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil_module, "disk_usage", lambda path: usage(10**9, 10**9, 1024))
    with pytest.raises(CapsmedError, match="MiB free, a run of this model needs about"):
        _run(tiny_h5, tmp_path, "full-disk")
    assert not (tmp_path / "full-disk").exists()  # refused before anything was written


def test_imbalance_finds_a_class_typed_in_another_unicode_form():
    import unicodedata

    nfd = unicodedata.normalize("NFD", "lésion")  # as a folder copied from macOS names it
    idx = select_training_indices(LABELS, ["healthy", nfd],
                                  DataChallenge(imbalance={"lésion": 20}), 0)
    assert np.bincount(LABELS[idx]).tolist() == [600, 80]
    with pytest.raises(CapsmedError, match="twice"):  # NFC and NFD: one class twice
        select_training_indices(LABELS, ["healthy", nfd],
                                DataChallenge(imbalance={"lésion": 20, nfd: 50}), 0)


def test_a_per_class_limit_above_a_class_size_is_reported(tiny_h5, caplog):
    """At most X per class keeps all of a smaller class: the run has fewer than the X
    asked for, and with no class above X the limit keeps every sample. Neither was said."""
    from capsmed.data.contract import read_info
    from capsmed.train.run_data import select_rows

    info = read_info(tiny_h5)
    counts = np.bincount(load_split(tiny_h5, "train").labels, minlength=2)
    assert counts.min() < counts.max()  # a limit between the two class sizes
    limit = int(counts.min()) + 1
    cfg = TrainConfig(data=str(tiny_h5), arch="lenet", per_class_limit=limit)
    with caplog.at_level("WARNING", logger="capsmed.data.challenges"):
        rows = select_rows(info, cfg)
    small = info.class_names[int(counts.argmin())]
    assert len(rows.train_rows) == counts.min() + limit
    assert f"--per-class-limit {limit}: 1 class(es) have fewer samples and keep all of " \
           f"them: {small} ({counts.min()})" in caplog.text
    assert "keeps every sample" not in caplog.text
    caplog.clear()
    above = int(counts.max()) + 1
    with caplog.at_level("WARNING", logger="capsmed.data.challenges"):
        select_rows(info, TrainConfig(data=str(tiny_h5), arch="lenet", per_class_limit=above))
    assert "2 class(es) have fewer samples" in caplog.text
    assert "no class has more, so the limit keeps every sample" in caplog.text
