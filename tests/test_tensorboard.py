"""``--tensorboard``: grouped scalars at every epoch and the run's hyper-parameters with
the kept and last epoch's numbers, read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import json

import pytest

from capsmed.train.config import TrainConfig
from capsmed.train.engine import train
from tests.faults.common import TINY_LENET

pytest.importorskip("tensorboard")


def test_scalars_are_grouped_and_options_are_hparams(tiny_h5, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    run = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=2, batch_size=16,
                            tensorboard=True, out=str(tmp_path / "tb"),
                            model_kwargs=TINY_LENET), disable_progress=True)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"loss/train", "loss/val", "accuracy/train", "accuracy/val", "optimizer/lr",
            "speed/images_per_s"} <= scalars
    assert not {"train_loss", "val_loss"} & scalars  # no flat names left
    assert [(e.step, e.value) for e in events.Scalars("loss/val")] == \
        [(r["epoch"], pytest.approx(r["val_loss"])) for r in records]

    content = events.PluginTagToContent("hparams")
    data = {tag: plugin_data_pb2.HParamsPluginData.FromString(blob)
            for tag, blob in content.items()}
    start = data["_hparams_/session_start_info"].session_start_info
    assert start.hparams["arch"].string_value == "lenet"
    assert start.hparams["batch_size"].number_value == 16
    assert start.hparams["model.widths"].string_value == "[3, 4]"
    assert start.hparams["augment"].bool_value is False
    metrics = {m.name.tag for m in data["_hparams_/experiment"].experiment.metric_infos}
    assert {"best/epoch", "best/val_loss", "best/val_acc", "final/train_loss"} <= metrics
    kept = json.loads((run / "summary.json").read_text())["best_epoch"]
    best = next(r for r in records if r["epoch"] == kept)
    assert events.Scalars("best/epoch")[-1].value == kept
    assert events.Scalars("best/val_loss")[-1].value == pytest.approx(best["val_loss"])
    assert events.Scalars("final/train_loss")[-1].value == \
        pytest.approx(records[-1]["train_loss"])


def test_a_run_resumed_after_a_crash_shows_each_epoch_once(tiny_h5, tmp_path, monkeypatch):
    """A run killed after its last saved state (here: the start) had logged epochs 1-2;
    resumed, it logs them again. TensorBoard shows each epoch once, as metrics.jsonl
    does, not both attempts' values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from capsmed.train import handlers as handlers_module
    from capsmed.train.engine import resume
    from capsmed.train.handlers import HANDLERS, LoopHandler

    class NodeLost(LoopHandler):  # after TensorBoard, before the resumable state
        @classmethod
        def create(cls, run):
            return cls()

        def on_epoch_end(self, loop):
            if loop.record["epoch"] == 2:
                raise RuntimeError("node lost")

    run = tmp_path / "tb"
    monkeypatch.setattr(handlers_module, "HANDLERS", (*HANDLERS[:-1], NodeLost, HANDLERS[-1]))
    with pytest.raises(RuntimeError, match="node lost"):
        train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=3, batch_size=16,
                          tensorboard=True, out=str(run), model_kwargs=TINY_LENET),
              disable_progress=True)
    monkeypatch.setattr(handlers_module, "HANDLERS", HANDLERS)
    resume(run, disable_progress=True)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss/train")] == \
        [(r["epoch"], pytest.approx(r["train_loss"])) for r in records]
