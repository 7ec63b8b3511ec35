"""--cuda-graph's step wrapper, on a CPU, with a stand-in for torch.cuda's graph API:
capturing records the step (and undoes what running it changed, as a real capture
runs nothing), replaying runs it again. A training run through it must equal the eager
run: the warm-up steps are real ones, a partial batch runs the plain step, a new
learning rate is captured again and the epoch's sums are part of the captured step.
An augmented run draws its transforms outside the graph (a real capture would freeze
the draws into it): the stand-in refuses a capture that draws.
The real graphs are checked on a GPU by benchmarks/gpu_check.py (train-modes)."""

from __future__ import annotations

import contextlib
import copy
import json

import pytest
import torch
from safetensors.torch import load_file

import capsmed.train.run as run_module
from capsmed.train.config import TrainConfig
from capsmed.train.engine import resume, train
from capsmed.train.loop import TrainingInterrupted
from capsmed.train.step import GraphedTrainStep

TINY_LENET = {"widths": [3, 4], "hidden": [8]}


class StandInCuda:
    """torch.cuda with Stream, stream, current_stream, CUDAGraph and graph replaced."""

    def __init__(self, real, events):
        self.real, self.events, self.wrapper = real, events, None

    def __getattr__(self, name):
        return getattr(self.real, name)

    class Stream:
        def wait_stream(self, other):
            pass

    def current_stream(self):
        return self.Stream()

    @contextlib.contextmanager
    def stream(self, stream):
        self.events.append("side stream")
        yield

    class CUDAGraph:
        def replay(self):
            self.run()

    @contextlib.contextmanager
    def graph(self, graph):
        step = self.wrapper.step
        saved = (copy.deepcopy(step.model.state_dict()),
                 copy.deepcopy(step.optimizer.state_dict()),
                 [t.clone() for t in (step.tally.sums, step.tally.bad_step, step.tally.step)],
                 torch.get_rng_state())
        rng = step.settings.augment_rng
        drawn = None if rng is None else rng.get_state()
        yield
        assert rng is None or torch.equal(rng.get_state(), drawn), \
            "the capture drew random transforms: every replay would repeat them"
        step.model.load_state_dict(saved[0])
        step.optimizer.load_state_dict(saved[1])
        for tensor, value in zip((step.tally.sums, step.tally.bad_step, step.tally.step),
                                 saved[2], strict=True):
            tensor.copy_(value)
        torch.set_rng_state(saved[3])
        graph.run = lambda: self.events.append("replay") or self.wrapper.run_static()
        self.events.append(f"capture at lr {step.optimizer.param_groups[0]['lr']:.2e}")


def _cfg(data, out, **options):
    return TrainConfig(data=str(data), arch="lenet", epochs=3, batch_size=16, seed=3,
                       out=str(out), model_kwargs=TINY_LENET, lr=1e-3,
                       lr_schedule="exponential", lr_decay=0.5, patience=None, **options)


def _metrics(run):
    return [{k: v for k, v in json.loads(x).items() if k not in ("seconds", "images_per_s")}
            for x in (run / "metrics.jsonl").read_text().splitlines()]


def _same_weights(a, b):
    wa, wb = (load_file(str(r / "checkpoint.safetensors")) for r in (a, b))
    return all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("options", [
    {}, {"augment": True, "augment_recipe": "rotation=20,translation=0.1,hflip,vflip"}],
    ids=["plain", "augmented"])
def test_a_graphed_run_replays_the_eager_run(tiny_h5, tmp_path, monkeypatch, options):
    from capsmed.data.contract import read_info

    train_rows = read_info(tiny_h5).split_sizes["train"]
    assert train_rows % 16 and train_rows // 16 == 2  # 2 full batches and a partial one
    eager = train(_cfg(tiny_h5, tmp_path / "eager", **options), disable_progress=True)
    events: list[str] = []
    cuda = StandInCuda(torch.cuda, events)
    monkeypatch.setattr(torch, "cuda", cuda)
    monkeypatch.setattr(run_module, "check_cuda_graph", lambda *args: None)  # a CPU
    real_init = GraphedTrainStep.__init__

    def init(self, step, warmup=3):
        real_init(self, step, warmup)
        for group in step.optimizer.param_groups:
            group["capturable"] = False  # CPU Adam refuses capturable state
        cuda.wrapper = self

    monkeypatch.setattr(GraphedTrainStep, "__init__", init)
    graphed = train(_cfg(tiny_h5, tmp_path / "graphed", cuda_graph=True, **options),
                    disable_progress=True)
    # 6 full batches: 3 warm-up steps on the side stream, then replays, captured
    # again when the schedule halved the learning rate
    assert events == ["side stream"] * 3 + ["capture at lr 5.00e-04", "replay",
                                             "capture at lr 2.50e-04", "replay", "replay"]
    assert _metrics(graphed) == _metrics(eager) and _same_weights(graphed, eager)
    # stopped inside the first epoch, right before its partial batch: the resumed
    # process starts with that batch, and still makes its graph for the full ones
    cut = tmp_path / "cut"
    try:
        train(_cfg(tiny_h5, cut, cuda_graph=True, **options), disable_progress=True,
              stop_after_steps=2)
    except TrainingInterrupted:
        pass
    else:
        raise AssertionError("the run was not stopped")
    events.clear()
    resumed = resume(cut, disable_progress=True)
    assert _metrics(resumed) == _metrics(eager) and _same_weights(resumed, eager)
    assert events.count("replay") == 1, events  # 4 full batches left: 3 warm-up steps
