"""``capsmed bench train`` runs at tiny size on CPU and records what it measured."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from capsmed.cli import app
from tests.helpers import TINY_CAPSNET, assert_clean_failure


def test_bench_train_appends_a_result_per_architecture(tmp_path):
    results = tmp_path / "bench.jsonl"
    args = ["bench", "train", "--arch", "capsnet", "--batch-size", "4", "--steps", "2",
            "--warmup", "1", "--device", "cpu", "--results", str(results)]
    for key, value in TINY_CAPSNET.items():
        args += ["--model-arg", f"{key}={value}".replace(" ", "")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    line = json.loads(results.read_text().splitlines()[0])
    assert line["arch"] == "capsnet" and line["input"] == "1x28x28, 10 classes"
    assert line["device"].startswith("cpu") and line["precision"] == "float32"
    assert line["train_images_per_s"] > 0 and line["eval_images_per_s"] > 0
    assert line["peak_memory_mib"] > 0 and line["steps"] == 2


def test_bench_train_writes_to_the_user_data_folder_not_the_current_one(tmp_path,
                                                                        monkeypatch):
    """In a checkout, benchmarks/results/train.jsonl relative to the current folder was
    a tracked file; the default is now the user's data folder, and the command says
    where it wrote."""
    import sys

    import capsmed.cli.bench as bench_cli
    from capsmed.io import user_data_dir

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data-home"))
    assert user_data_dir() == tmp_path / "data-home" / "capsmed"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert user_data_dir() == Path.home() / ".local" / "share" / "capsmed"
    assert bench_cli.DEFAULT_RESULTS.parts[-3:] == ("capsmed", "bench", "train.jsonl")
    assert "capsmed/bench/train.jsonl" in bench_cli.RESULTS_HELP

    # the command itself, with the data folder moved into tmp_path
    expected = tmp_path / "data-home" / "capsmed" / "bench" / "train.jsonl"
    monkeypatch.setattr(bench_cli, "DEFAULT_RESULTS", expected)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["bench", "train", "--arch", "lenet", "--batch-size",
                                      "4", "--steps", "1", "--warmup", "1", "--device",
                                      "cpu", "--model-arg", "widths=[3,4]", "--model-arg",
                                      "hidden=[8]"])
    assert result.exit_code == 0, result.output
    assert json.loads(expected.read_text())["arch"] == "lenet"
    assert f"appended to {expected}" in " ".join(result.output.split())  # wrapped at 80
    assert not (tmp_path / "benchmarks").exists()


def test_bench_and_models_refuse_impossible_settings_and_record_nothing(tmp_path):
    from tests.helpers import assert_clean_failure

    results = tmp_path / "bench.jsonl"
    base = ["bench", "train", "--arch", "lenet", "--device", "cpu", "--steps", "1",
            "--warmup", "0", "--results", str(results)]
    for args, message in ((["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
                          (["--steps", "0"], "--steps must be >= 1, got 0"),
                          (["--input-size", "0"], "--input-size must be >= 1, got 0"),
                          (["--num-classes", "1"], "--num-classes must be >= 2, got 1"),
                          (["--precision", "foo"], "--precision must be one of auto"),
                          (["--model-arg", "widths=abc"], "model option widths='abc' must"),
                          # the model was built for 20 classes, the line said 10
                          (["--model-arg", "num_classes=20"],
                           "--model-arg num_classes: the input shape is set with "
                           "--num-classes"),
                          (["--model-arg", "in_channels=3"], "set with --channels"),
                          # compilation timed as training: 1 img/s for a toy lenet
                          (["--compile"], "--compile needs --warmup 1 or more")):
        assert_clean_failure(CliRunner().invoke(app, [*base, *args]), message)
    assert not results.exists()  # the history that run --dry-run estimates from
    assert_clean_failure(CliRunner().invoke(app, ["models", "--channels", "0"]),
                         "--channels must be >= 1, got 0")


def _bench(results: Path, *extra: str) -> None:
    args = ["bench", "train", "--arch", "lenet", "--batch-size", "4", "--steps", "1",
            "--warmup", "0", "--device", "cpu", "--results", str(results), *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output


def test_a_line_records_its_model_options_and_estimates_take_only_default_models(
        tmp_path):
    """A line timed on a model built with --model-arg once read as the registry's
    default model: capsmed run --dry-run then estimated paper-size runs from a toy's
    rate."""
    from capsmed.pipeline.estimate import user_rates

    results = tmp_path / "bench" / "train.jsonl"
    _bench(results, "--model-arg", "widths=[3,4]", "--model-arg", "hidden=[8]")
    _bench(results)
    tiny, default = (json.loads(line) for line in results.read_text().splitlines())
    assert tiny["model_options"] == {"widths": [3, 4], "hidden": [8]}
    assert default["model_options"] == {}
    [rate] = user_rates(tmp_path / "bench")
    assert rate.images_per_s == default["train_images_per_s"]


def test_a_result_after_a_line_cut_short_is_a_line_of_its_own(tmp_path):
    """A cut last line (a full disk, a killed writer) swallowed the next result."""
    from capsmed.pipeline.estimate import user_rates

    results = tmp_path / "train.jsonl"
    results.write_text('{"arch": "lenet", "device": "cp')
    _bench(results)
    cut, line = results.read_text().splitlines()
    assert cut == '{"arch": "lenet", "device": "cp'
    assert json.loads(line)["arch"] == "lenet"
    [rate] = user_rates(tmp_path)
    assert rate.images_per_s == json.loads(line)["train_images_per_s"]


def _mnist_run(tmp_path: Path, arch: str, **train):
    """A jimenez2018 MNIST run (sizes from its expect:) with ``train`` options changed."""
    import dataclasses

    from capsmed.pipeline.spec import load_pipeline

    pipeline = load_pipeline(Path(__file__).resolve().parents[1] / "pipelines" /
                             "jimenez2018.yaml", {"out": str(tmp_path / "out")})
    run = next(r for r in pipeline.runs if r.fields["arch"] == arch
               and r.fields["dataset"] == "mnist")
    return pipeline, dataclasses.replace(run, train={**run.train, **train})


def _gpu_line(**fields) -> str:
    return json.dumps({"arch": "lenet", "device": "NVIDIA H100 80GB HBM3",
                       "precision": "bfloat16", "batch_size": 128,
                       "input": "1x28x28, 10 classes", "train_images_per_s": 1e6,
                       "compiled": False, "cuda_graph": False, "tf32": False,
                       "model_options": {}, **fields})


def test_an_fp32_gpu_run_is_not_estimated_from_tf32_convolution_figures(tmp_path):
    """gpu_check's 'eager-fp32' H100 cells ran cuDNN convolutions in TF32 (timed before
    --precision fp32 meant IEEE fp32), and were shipped as fp32 rates: an fp32 run on a
    GPU was estimated from them. So was an old bench line (no tf32 key) from CUDA."""
    from capsmed.pipeline.estimate import estimate_run, user_rates
    from capsmed.pipeline.throughput import RATES

    pipeline, run = _mnist_run(tmp_path, "lenet", precision="fp32")
    assert estimate_run(pipeline, run, 1, list(RATES)) is None
    bench = tmp_path / "bench"
    bench.mkdir()
    old = json.loads(_gpu_line(precision="float32"))
    del old["tf32"]
    (bench / "train.jsonl").write_text(json.dumps(old) + "\n")
    assert estimate_run(pipeline, run, 1, user_rates(bench)) is None
    (bench / "train.jsonl").write_text(_gpu_line(precision="float32", batch_size=256,
                                                 train_images_per_s=2e5) + "\n")
    seconds, rate = estimate_run(pipeline, run, 1, user_rates(bench))  # IEEE fp32: taken
    assert rate.precision == "fp32" and seconds == run.train["epochs"] * 55000 / 2e5


def test_a_compiled_or_graphed_rate_is_not_an_eager_runs_and_back(tmp_path):
    """A user's 'bench train --cuda-graph' line (lenet: 12x eager on an H100) was taken
    for every lenet run, graphed or not; a compiled+graphed run took eager rates."""
    from capsmed.pipeline.estimate import estimate_run, user_rates
    from capsmed.pipeline.throughput import RATES

    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "train.jsonl").write_text(_gpu_line(cuda_graph=True) + "\n")
    graphed = user_rates(bench)
    assert [r.mode for r in graphed] == ["graph"]
    pipeline, eager = _mnist_run(tmp_path, "lenet")
    _, rate = estimate_run(pipeline, eager, 1, [*graphed, *RATES])
    assert rate.mode == "eager" and rate.images_per_s != 1e6  # the shipped eager rate
    _, graph = _mnist_run(tmp_path, "lenet", cuda_graph=True)
    _, rate = estimate_run(pipeline, graph, 1, [*graphed, *RATES])
    assert rate.mode == "graph" and rate.images_per_s == 1e6
    _, both = _mnist_run(tmp_path, "capsnet", compile=True, cuda_graph=True)
    assert estimate_run(pipeline, both, 1, list(RATES)) is None  # only eager shipped


def test_a_later_architecture_in_one_cpu_command_records_no_peak_of_its_own(tmp_path):
    """On a CPU the peak is the process's RSS so far: with two --arch, the second line
    recorded the first model's peak as its own (capsnet's 600 MiB for lenet's 360)."""
    results = tmp_path / "bench.jsonl"
    result = CliRunner().invoke(app, [
        "bench", "train", "--arch", "lenet", "--arch", "lenet", "--batch-size", "4",
        "--steps", "1", "--warmup", "0", "--device", "cpu", "--results", str(results),
        "--model-arg", "widths=[3,4]", "--model-arg", "hidden=[8]"])
    assert result.exit_code == 0, result.output
    first, second = (json.loads(line) for line in results.read_text().splitlines())
    assert first["peak_memory_mib"] > 0 and second["peak_memory_mib"] is None
    assert "the first --arch's only" in " ".join(result.output.split())


def test_results_that_are_not_a_json_lines_file_are_refused_before_measuring(tmp_path):
    """--results given a dataset .h5 appended a JSON line to the HDF5 file (its digest
    changed under the runs that point to it) and exited 0."""
    results = tmp_path / "shapes.h5"
    content = b"\x89HDF\r\n\x1a\n" + bytes(range(256))
    results.write_bytes(content)
    result = CliRunner().invoke(app, ["-q", "bench", "train", "--arch", "lenet", "--steps",
                                      "1", "--warmup", "0", "--device", "cpu",
                                      "--results", str(results)])
    assert_clean_failure(result, f"{results}: not a JSON-lines results file")
    assert results.read_bytes() == content


def test_no_warm_up_on_a_gpu_is_refused_before_anything_runs_there(monkeypatch):
    """--warmup 0 was refused only with --compile; on CUDA capsmed compiles the capsule
    routing anyway (and loads the kernels) in the first step, whose seconds were then
    timed as training: a capsnet's images/s far below its real rate, exit 0."""
    import pytest
    import torch

    from capsmed.errors import CapsmedError
    from capsmed.train import bench

    monkeypatch.setattr(bench, "select_device", lambda name: torch.device("cuda"))
    with pytest.raises(CapsmedError, match="--warmup 0 on a GPU: the first step compiles"):
        bench.bench_train("capsnet", batch_size=2, device="cuda", steps=1, warmup=0)
