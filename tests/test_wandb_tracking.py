"""W&B logging (``--wandb``) in offline mode: the run's local record read back (config,
per-epoch history, summary, saved files); training unchanged by it; resume continues
the same W&B run; refused without the package."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from capsmed.train.config import TrainConfig
from capsmed.train.engine import resume, train
from capsmed.train.handlers import HANDLERS
from capsmed.train.handlers.wandb_tracking import WANDB_FILE
from capsmed.train.loop import TrainingInterrupted
from tests.faults.common import TINY_LENET, invoke, lenet_args
from tests.faults.conftest import write_toy
from tests.helpers import assert_clean_failure

wandb = pytest.importorskip("wandb")


@pytest.fixture(scope="module")
def wandb_dir(tmp_path_factory):
    """One folder for the module: W&B reads WANDB_DIR once per process (its settings
    are a singleton), so runs are told apart by their ids, not their folders."""
    folder = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_DIR", str(folder))
        patch.setenv("WANDB_SILENT", "true")
        yield folder


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    return write_toy(tmp_path_factory.mktemp("toy") / "toy.h5")


def _cfg(data: Path, out: Path, **options) -> TrainConfig:
    return TrainConfig(**{"data": str(data), "arch": "lenet", "epochs": 2, "batch_size": 16,
                          "seed": 5, "out": str(out), "model_kwargs": TINY_LENET,
                          "steps_per_epoch": 2, **options})


def _records(run_file: Path) -> list:
    """The records of an offline run's ``.wandb`` file: W&B's 7-byte header, then a
    LevelDB log (32 KiB blocks of chunks: CRC, length, type FULL/FIRST/MIDDLE/LAST)."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos = run_file.read_bytes(), 32768, 7
    assert data[:4] == b":W&B"
    records, parts = [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):  # a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
    return records


def _offline_run(wandb_dir: Path, run_id: str) -> tuple[dict, list[dict], dict, Path]:
    """(config, history rows, summary, files folder) of the offline run ``run_id``."""
    folders = sorted((wandb_dir / "wandb").glob(f"offline-run-*-{run_id}*"))
    assert folders, list((wandb_dir / "wandb").iterdir())
    config, history, summary = {}, [], {}
    for record in _records(folders[-1] / f"run-{run_id}.wandb"):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
        elif kind == "history":
            history.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                            for i in record.history.item})
        elif kind == "summary":
            summary.update({"/".join(u.nested_key) or u.key: json.loads(u.value_json)
                            for u in record.summary.update})
    return config, history, summary, folders[-1] / "files"


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_logged_run_is_read_back_and_trains_exactly_as_unlogged(toy, tmp_path, wandb_dir):
    plain = train(_cfg(toy, tmp_path / "plain"), disable_progress=True)
    logged = train(_cfg(toy, tmp_path / "logged", wandb="capsmed-tests"),
                   disable_progress=True)
    a, b = load_file(str(plain / "checkpoint.safetensors")), \
        load_file(str(logged / "checkpoint.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    strip = ("seconds", "images_per_s")
    assert [{k: v for k, v in r.items() if k not in strip} for r in _metrics(plain)] == \
        [{k: v for k, v in r.items() if k not in strip} for r in _metrics(logged)]

    record = json.loads((logged / WANDB_FILE).read_text())
    assert record["project"] == "capsmed-tests"
    config, history, summary, files = _offline_run(wandb_dir, record["run_id"])
    assert config["arch"] == "lenet" and config["batch_size"] == 16
    assert config["model.widths"] == "[3, 4]" and config["capsmed.dataset"] == "toy"
    assert f"digest: {config['capsmed.dataset_digest']}" in (logged / "config.yaml").read_text()
    epochs = [(h["_step"], h["val_loss"]) for h in history if "val_loss" in h]
    assert epochs == [(r["epoch"], r["val_loss"]) for r in _metrics(logged)]
    assert summary["best_epoch"] == json.loads((logged / "summary.json").read_text())[
        "best_epoch"]
    for name in ("summary.json", "curves.png", "metrics.jsonl"):
        assert (files / name).read_bytes() == (logged / name).read_bytes(), name


def test_resume_continues_the_same_wandb_run(toy, tmp_path, wandb_dir):
    cfg = _cfg(toy, tmp_path / "run", wandb="capsmed-tests", epochs=3,
               state_every_minutes=0)
    with pytest.raises(TrainingInterrupted):
        train(cfg, disable_progress=True, stop_after_steps=3)  # inside epoch 2
    record = json.loads((tmp_path / "run" / WANDB_FILE).read_text())
    resume(tmp_path / "run", disable_progress=True)
    assert json.loads((tmp_path / "run" / WANDB_FILE).read_text()) == record
    # the run's two parts, one W&B run id (a second folder "-1" in the same second)
    steps = []
    for folder in sorted((wandb_dir / "wandb").glob(f"offline-run-*-{record['run_id']}*")):
        for part in _records(folder / f"run-{record['run_id']}.wandb"):
            if part.WhichOneof("record_type") == "history":
                items = {i.nested_key[0]: json.loads(i.value_json) for i in part.history.item}
                steps += [items["_step"]] if "train_loss" in items else []
    assert steps == [1, 2, 3]


def test_without_wandb_installed_the_option_is_refused(toy, tmp_path, monkeypatch,
                                                      wandb_dir):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
    out = tmp_path / "run"
    result = invoke(lenet_args(toy, out, "--wandb", "p"))
    assert_clean_failure(result, "pip install 'capsmed[wandb]'", out)


def test_wandb_follows_the_summary_and_precedes_the_state():
    names = [h.__name__ for h in HANDLERS]
    assert names.index("RunSummary") < names.index("WandbTracking") \
        < names.index("ResumableState")


def test_a_w_and_b_run_that_cannot_start_stops_before_the_first_step(toy, tmp_path,
                                                                     monkeypatch, wandb_dir):
    def no_key(**kwargs):
        raise wandb.errors.UsageError("No API key configured")

    monkeypatch.setattr(wandb, "init", no_key)
    out = tmp_path / "run"
    result = invoke(lenet_args(toy, out, "--wandb", "p"))
    assert_clean_failure(result, "cannot start its W&B run in project 'p' (No API key")
    assert "capsmed train --resume" in result.stderr
    assert not (out / "metrics.jsonl").exists()


def test_resume_warns_that_w_and_b_keeps_epochs_of_an_attempt_lost_after_the_state(
        toy, tmp_path, wandb_dir, monkeypatch, caplog):
    """A run killed after its last saved state had logged later epochs; the resumed run
    logs them again, which W&B drops (a step below its current one), keeping the lost
    attempt's values without a word from capsmed. The server's next step is stood in for
    (offline runs start at 0)."""
    from capsmed.train.step import TrainStep

    original = TrainStep.__call__
    calls = {"n": 0}

    def dying(self, *args):
        calls["n"] += 1
        if calls["n"] == 6:  # in epoch 3: only the start's state (default interval)
            raise KeyboardInterrupt  # as a kill: no state is saved on the way out
        return original(self, *args)

    monkeypatch.setattr(TrainStep, "__call__", dying)
    run = tmp_path / "run"
    with pytest.raises(TrainingInterrupted):
        train(_cfg(toy, run, wandb="capsmed-tests", epochs=3), disable_progress=True)
    monkeypatch.setattr(TrainStep, "__call__", original)
    assert len(_metrics(run)) == 2
    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "starting_step", property(lambda self: 3))
    with caplog.at_level("WARNING", logger="capsmed.train.handlers.wandb_tracking"):
        resume(run, disable_progress=True)
    assert "already holds epochs 1-2, logged by an attempt lost" in caplog.text
