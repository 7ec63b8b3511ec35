"""``capsmed train`` options reach the config with the value typed (the training itself
replaced by a stub that records its config)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from capsmed.cli import app
from tests.helpers import assert_clean_failure

runner = CliRunner()


@pytest.fixture
def trained(monkeypatch, tmp_path):
    """The configs ``capsmed train`` passes to the engine."""
    import capsmed.train.engine as engine

    seen = []
    monkeypatch.setattr(engine, "train", lambda cfg: seen.append(cfg) or tmp_path / "run")
    return seen


def _train(tmp_path, *args: str):
    return runner.invoke(app, ["-q", "train", "--data", str(tmp_path / "d.h5"), "--arch",
                               "lenet", *args])


@pytest.mark.parametrize("typed, patience", [("none", None), ("None", None), ("7", 7)])
def test_patience_none_never_stops_early_as_the_help_says(trained, tmp_path, typed,
                                                          patience):
    """The help promised "None never stops early", but --patience took integers only
    (and 0 is refused): a run without early stopping needed a YAML file."""
    result = _train(tmp_path, "--patience", typed)
    assert result.exit_code == 0, result.output
    assert trained[0].patience == patience


def test_patience_none_overrides_a_config_file(trained, tmp_path):
    config = tmp_path / "opts.yaml"
    config.write_text("patience: 5\nepochs: 3\n")
    result = _train(tmp_path, "--config", str(config), "--patience", "none")
    assert result.exit_code == 0, result.output
    assert (trained[0].patience, trained[0].epochs) == (None, 3)


@pytest.mark.parametrize("typed, text", [("0", "patience must be >= 1, got 0"),
                                         ("soon", "--patience must be a number of epochs "
                                                  "or none, got 'soon'")])
def test_a_bad_patience_is_refused(trained, tmp_path, typed, text):
    assert_clean_failure(_train(tmp_path, "--patience", typed), text)
    assert not trained
