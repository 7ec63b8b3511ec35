"""Every file in examples/ runs as its comments say, at toy size."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from capsmed.cli import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
runner = CliRunner()


def test_library_quickstart(tmp_path, capsys):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import library_quickstart
    finally:
        sys.path.remove(str(EXAMPLES))
    report = library_quickstart.main(tmp_path)
    assert set(report["per_class"]) == {"circle", "square", "triangle"}
    assert (tmp_path / "run" / "report" / "report.json").is_file()
    assert "sensitivity" in capsys.readouterr().out
    assert len(report["scores"]) == 4 and (tmp_path / "capsnet.pt2").is_file()


def test_train_config_example(tiny_h5, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["-q", "train", "--config", str(EXAMPLES / "train-config.yaml"),
                                 "--data", str(tiny_h5), "--epochs", "1", "--out", str(out),
                                 "--model-arg", "conv_channels=16",
                                 "--model-arg", "primary_types=4"])
    assert result.exit_code == 0, result.output
    config = yaml.safe_load((out / "config.yaml").read_text())["train"]
    assert config["fraction"] == 0.5 and config["augment"] and config["epochs"] == 1


@pytest.mark.slow
def test_custom_pipeline_example(tmp_path):
    result = runner.invoke(app, ["run", str(EXAMPLES / "pipeline-custom.yaml"), "--set",
                                 f"out={tmp_path}", "--set", "epochs=1", "--only", "seed=0"])
    assert result.exit_code == 0, result.output
    study = json.loads((tmp_path / "report" / "study.json").read_text())
    assert study["tables"][0]["runs"] == 4 and len(study["tables"][0]["cells"]) == 4


@pytest.mark.slow
def test_predict_slides_example(tmp_path, capsys):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import predict_slides
    finally:
        sys.path.remove(str(EXAMPLES))
    summary = predict_slides.main(tmp_path, epochs=1, size=1024)
    assert summary["inputs"] == 1 and summary["windows"] > 0 and not summary["failed"]
    assert (tmp_path / "predictions" / "geojson" / "slides_slide_005.geojson").is_file()
    assert "tumour tiles" in capsys.readouterr().out
