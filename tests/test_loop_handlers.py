"""The training loop's handlers: the registry's order, and a new handler (a tracker)
added by one line gets every event in order without changing the run."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from capsmed.train import handlers as handlers_module
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train
from capsmed.train.handlers import HANDLERS, LoopHandler
from capsmed.train.handlers.base import LoopState

TINY_LENET = {"widths": [3, 4], "hidden": [8]}


def _cfg(data, out, **options):
    return TrainConfig(**{"data": str(data), "arch": "lenet", "epochs": 2, "batch_size": 16,
                          "seed": 3, "out": str(out), "model_kwargs": TINY_LENET,
                          "steps_per_epoch": 3, **options})


class Recorder(LoopHandler):
    """What a tracker (MLflow, W&B) would be: it reads the loop at its events."""

    events: list[str] = []

    @classmethod
    def create(cls, run):
        return cls()

    def on_start(self, loop: LoopState) -> None:
        self.events.append(f"start {loop.progress.epoch}")

    def on_epoch_start(self, loop: LoopState) -> None:
        self.events.append("epoch")

    def on_step(self, loop: LoopState) -> None:
        self.events.append("step")

    def on_check(self, loop: LoopState) -> None:
        self.events.append("check")

    def on_epoch_end(self, loop: LoopState) -> None:
        self.events.append(f"end {loop.record['epoch']} {loop.record['train_loss']:.6f}")

    def on_end(self, loop: LoopState) -> None:
        self.events.append("done")

    def close(self) -> None:
        self.events.append("close")


def test_the_registry_orders_what_depends_on_order():
    names = [h.__name__ for h in HANDLERS]
    assert all(LoopHandler in h.__mro__ for h in HANDLERS)  # the events it does not write
    assert len(set(names)) == len(names)
    order = names.index
    # the metrics line of an epoch follows its checkpoint; the state written at an
    # epoch end knows about an early stop and a stop request; it is removed at the
    # end only once the summary is written
    assert order("BestCheckpoint") < order("MetricsFile")
    for before in ("EarlyStopping", "StopOnSignal", "RunSummary", "MetricsFile"):
        assert order(before) < order("ResumableState"), before


def test_a_new_handler_is_one_registration_and_changes_nothing(tiny_h5, tmp_path,
                                                               monkeypatch):
    plain = train(_cfg(tiny_h5, tmp_path / "plain"), disable_progress=True)
    monkeypatch.setattr(handlers_module, "HANDLERS", (*HANDLERS, Recorder))
    Recorder.events = []
    tracked = train(_cfg(tiny_h5, tmp_path / "tracked"), disable_progress=True)
    losses = [json.loads(line)["train_loss"]
              for line in (tracked / "metrics.jsonl").read_text().splitlines()]
    epoch = ["epoch", "step", "step", "step", "check"]
    assert Recorder.events == ["start 1", *epoch, f"end 1 {losses[0]:.6f}", *epoch,
                               f"end 2 {losses[1]:.6f}", "done", "close"]
    a, b = (load_file(str(r / "checkpoint.safetensors")) for r in (plain, tracked))
    assert all((a[k] == b[k]).all() for k in a)


def test_a_handler_that_fails_still_closes_the_others(tiny_h5, tmp_path, monkeypatch):
    import signal

    class Failing(LoopHandler):
        @classmethod
        def create(cls, run):
            return cls()

        def on_epoch_end(self, loop: LoopState) -> None:
            raise RuntimeError("tracker down")

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(handlers_module, "HANDLERS", (*HANDLERS, Failing))
    with pytest.raises(RuntimeError, match="tracker down"):
        train(_cfg(tiny_h5, tmp_path / "run"), disable_progress=True)
    assert signal.getsignal(signal.SIGTERM) == before  # StopOnSignal closed


def test_patience_running_out_at_the_last_epoch_is_no_early_stop(tiny_h5, tmp_path):
    """A run that trains every planned epoch did not stop early, even when the last one
    is the patience-th without a better validation loss."""
    options = {"epochs": 12, "patience": 1, "lr": 0.05, "seed": 1, "steps_per_epoch": None}
    stopped = train(_cfg(tiny_h5, tmp_path / "stopped", **options), disable_progress=True)
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["stopped_early"] and summary["epochs_run"] < 12
    last = summary["epochs_run"]  # patience ran out after this epoch
    planned = train(_cfg(tiny_h5, tmp_path / "planned", **{**options, "epochs": last}),
                    disable_progress=True)
    assert json.loads((planned / "summary.json").read_text()) == {
        **summary, "stopped_early": False}
