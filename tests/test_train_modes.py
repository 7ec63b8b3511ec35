"""capsmed train's speed modes on the CPU: what can be checked without a GPU.

fp32 is IEEE fp32 while training (TF32 off) and says so in config.yaml; tf32 and
--cuda-graph are refused in one line where they cannot work; the eager step's result
does not depend on the options that only a GPU uses. The CUDA-graph and compiled
training runs themselves are checked by benchmarks/gpu_check.py's train-modes part.
"""

from __future__ import annotations

import pytest
import torch
import yaml
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.errors import CapsmedError
from capsmed.train import distributed
from capsmed.train import handlers as handlers_module
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train
from capsmed.train.handlers import HANDLERS, LoopHandler
from capsmed.train.run_checks import check_cuda_graph
from capsmed.train.step import float32_matmuls, precision_mode
from tests.helpers import assert_clean_failure

TINY_LENET = {"widths": [3, 4], "hidden": [8]}


def _args(data, out, *extra):
    return ["train", "--data", str(data), "--arch", "lenet", "--epochs", "1",
            "--batch-size", "16", "--model-arg", "widths=[3,4]", "--model-arg",
            "hidden=[8]", "--device", "cpu", "--out", str(out), *extra]


@pytest.mark.parametrize("extra, text", [
    (["--cuda-graph"], "--cuda-graph needs a CUDA device (this run's is cpu)"),
    (["--precision", "tf32"], "--precision tf32 needs a CUDA GPU of compute capability 8.0"),
], ids=["cuda-graph", "tf32"])
def test_modes_a_cpu_cannot_run_are_refused_before_the_folder(tiny_h5, tmp_path, extra, text):
    run = tmp_path / "run"
    assert_clean_failure(CliRunner().invoke(app, _args(tiny_h5, run, *extra)), text,
                         output=run)


@pytest.mark.parametrize("extra, text", [
    (["--mlflow-experiment", "ablation"], "mlflow_experiment 'ablation' has no effect "
     "without mlflow"),
    (["--no-freeze-transferred"], "freeze_transferred false has no effect without "
     "transfer_from"),
], ids=["mlflow-experiment", "no-freeze-transferred"])
def test_options_nothing_else_asked_for_are_refused_before_the_folder(tiny_h5, tmp_path,
                                                                      extra, text):
    """Accepted and unused: a run not tracked, or trained from scratch, said nothing."""
    run = tmp_path / "run"
    assert_clean_failure(CliRunner().invoke(app, _args(tiny_h5, run, *extra)), text,
                         output=run)


CUDA = torch.device("cuda")  # only its type is read: no GPU needed


@pytest.mark.parametrize("options, precision, ctx, text", [
    ({}, "fp16", distributed.Distributed(), "does not work with fp16"),
    ({}, "bf16", distributed.Distributed(world=2), "does not work under torchrun"),
])
def test_cuda_graph_refusals_on_a_gpu(options, precision, ctx, text):
    cfg = TrainConfig(data="x.h5", arch="lenet", cuda_graph=True, **options)
    with pytest.raises(CapsmedError, match=f"^--cuda-graph {text}"):
        check_cuda_graph(cfg, CUDA, ctx, precision)
    check_cuda_graph(TrainConfig(data="x.h5", arch="lenet", **options), CUDA, ctx,
                      precision)  # without --cuda-graph: nothing to refuse


def test_cuda_graph_takes_augmentation():
    """The graph takes the augmentation's draws as inputs (drawn eagerly before each
    replay), so an augmented run can be graphed (tests/test_graphed_step.py)."""
    check_cuda_graph(TrainConfig(data="x.h5", arch="lenet", cuda_graph=True, augment=True),
                     CUDA, distributed.Distributed(), "bf16")


def test_precision_names_the_mode_it_runs_and_tf32_switches_only_for_tf32():
    cpu = torch.device("cpu")
    assert [precision_mode(p, cpu) for p in ("auto", "fp32", "bf16", "fp16")] == [
        "fp32", "fp32", "bf16", "fp16"]
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = matmul.allow_tf32, cudnn.allow_tf32
    try:
        matmul.allow_tf32 = cudnn.allow_tf32 = True  # as a user's script might have left
        with float32_matmuls("fp32"):
            assert (matmul.allow_tf32, cudnn.allow_tf32) == (False, False)
        assert (matmul.allow_tf32, cudnn.allow_tf32) == (True, True)  # restored
        matmul.allow_tf32 = cudnn.allow_tf32 = False
        with float32_matmuls("tf32"):
            assert (matmul.allow_tf32, cudnn.allow_tf32) == (True, True)
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before


class TF32Probe(LoopHandler):
    seen: list[bool] = []

    @classmethod
    def create(cls, run):
        return cls()

    def on_step(self, loop) -> None:
        self.seen.append(torch.backends.cudnn.allow_tf32 or
                         torch.backends.cuda.matmul.allow_tf32)


def test_fp32_trains_with_tf32_off_and_config_yaml_says_so(tiny_h5, tmp_path, monkeypatch):
    monkeypatch.setattr(handlers_module, "HANDLERS", (*HANDLERS, TF32Probe))
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)  # PyTorch's default
    TF32Probe.seen = []
    run = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                            out=str(tmp_path / "run"), model_kwargs=TINY_LENET,
                            precision="fp32", steps_per_epoch=2), disable_progress=True)
    assert TF32Probe.seen == [False, False]
    assert torch.backends.cudnn.allow_tf32  # the process's setting is restored
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["environment"]["precision"] == "float32"  # IEEE
    assert config["environment"]["tf32"] is False
    assert config["train"]["cuda_graph"] is False


@pytest.mark.parametrize("extra, text", [
    (["--precision", "tf32"], "--precision tf32 needs a CUDA GPU"),
    (["--cuda-graph"], "--cuda-graph needs a CUDA device"),
], ids=["tf32", "cuda-graph"])
def test_bench_refuses_modes_a_cpu_cannot_run_and_records_nothing(tmp_path, extra, text):
    results = tmp_path / "bench.jsonl"
    args = ["bench", "train", "--arch", "lenet", "--device", "cpu", "--steps", "1",
            "--results", str(results), *extra]
    assert_clean_failure(CliRunner().invoke(app, args), text)
    assert not results.exists()


def test_a_resumed_run_whose_options_need_a_gpu_names_its_config_yaml(tiny_h5, tmp_path):
    from capsmed.train.loop import TrainingInterrupted

    run = tmp_path / "run"
    with pytest.raises(TrainingInterrupted):
        train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                          out=str(run), model_kwargs=TINY_LENET), disable_progress=True,
              stop_after_steps=1)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("cuda_graph: false", "cuda_graph: true"))
    result = CliRunner().invoke(app, ["train", "--resume", str(run)])
    assert_clean_failure(result, f"{config}: the run's options ask for it: --cuda-graph "
                         "needs a CUDA device")
    assert (run / "resume.pt").is_file()
