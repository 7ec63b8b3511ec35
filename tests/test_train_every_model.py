"""`capsmed train` then `capsmed evaluate` for every registered architecture (tiny widths)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.models import list_models
from tests.helpers import TINY

pytestmark = pytest.mark.slow  # every model trained and evaluated end to end

runner = CliRunner()


@pytest.mark.parametrize("entry", list_models(), ids=lambda e: e.name)
def test_train_and_evaluate_every_registered_model(entry, tiny_h5, tmp_path):
    run = tmp_path / entry.name
    args = ["-q", "train", "--data", str(tiny_h5), "--arch", entry.name, "--epochs", "1",
            "--batch-size", "16", "--out", str(run)]
    for key, value in TINY.get(entry.name, {}).items():
        args += ["--model-arg", f"{key}={json.dumps(value)}"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output + result.stderr
    assert json.loads((run / "checkpoint.json").read_text())["arch"] == entry.name
    result = runner.invoke(app, ["-q", "evaluate", str(run)])
    assert result.exit_code == 0, result.stderr
    report = json.loads((run / "report" / "report.json").read_text())
    assert report["total"]["support"] == report["samples"] > 0


def test_every_registered_model_has_a_tiny_configuration():
    # new architectures must add their reduced widths to tests/test_models.py::TINY
    assert {e.name for e in list_models()} == set(TINY)
