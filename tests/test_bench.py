"""``capsmed bench train`` runs at tiny size on CPU and records what it measured."""

from __future__ import annotations

import json

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
