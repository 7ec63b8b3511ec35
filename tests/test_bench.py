"""``capsmed bench train`` runs at tiny size on CPU and records what it measured."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from capsmed.cli import app
from tests.helpers import TINY_CAPSNET


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
                          (["--model-arg", "in_channels=3"], "set with --channels")):
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
