"""Every default a ``capsmed preprocess --help`` shows is the config dataclass default.

The check is behavioural: typing the shown default on the command line must build the
same config as leaving the option out (the library function is replaced by a stub that
records its config), so a help text cannot drift from the dataclass it overrides.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import typer.main
from typer.core import TyperOption
from typer.testing import CliRunner

from capsmed.cli import app

runner = CliRunner()

# command -> (library module, function, arguments a valid baseline needs)
COMMANDS = {
    "tupac16": ("capsmed.data.sources.tupac16.reader", "preprocess_tupac16", []),
    "diaretdb1": ("capsmed.data.sources.diaretdb1.reader", "preprocess_diaretdb1", []),
    "aml": ("capsmed.data.sources.aml.reader", "preprocess_aml", []),
    "folder": ("capsmed.data.sources.folder.reader", "preprocess_folder", []),
    "wsi": ("capsmed.data.sources.wsi.reader", "preprocess_wsi", ["--slide-labels", "labels.csv"]),
    "medmnist": ("capsmed.data.sources.medmnist.reader", "preprocess_medmnist", []),
    "mnist": ("capsmed.data.sources.mnist.reader", "preprocess_mnist", []),
    "fashion-mnist": ("capsmed.data.sources.mnist.reader", "preprocess_mnist", []),
    "multimnist": ("capsmed.data.sources.mnist.multimnist", "preprocess_multimnist", []),
    "affnist": ("capsmed.data.sources.mnist.affnist", "preprocess_affnist", []),
}
_BRACKET = re.compile(r"\[([^\[\]]*)\]\.$")


def _command(name: str):
    group = typer.main.get_command(app)
    return group.commands["preprocess"].commands[name]


def _config(monkeypatch, name: str, args: list[str]):
    """The config the command passes to the library, for ``args``."""
    import importlib

    module, function, baseline = COMMANDS[name]
    seen = []
    monkeypatch.setattr(importlib.import_module(module), function,
                        lambda *a, **kw: seen.append(a[2]) or a[1])
    result = runner.invoke(app, ["preprocess", name, "raw", "-o", "out.h5", *baseline,
                                 *args])
    assert result.exit_code == 0, f"{name} {args}: {result.output}"
    return seen[0]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_shown_default_is_the_config_default(name, monkeypatch):
    baseline = _config(monkeypatch, name, [])
    fields = {f.name: f for f in dataclasses.fields(baseline)}
    checked = 0
    for param in _command(name).params:
        if not isinstance(param, TyperOption) or param.name in ("output", "help"):
            continue
        help_text = param.help or ""
        assert "default:" not in help_text.lower() and "(default" not in help_text, help_text
        assert not param.show_default, f"--{param.name}: typer adds its own default"
        field = fields.get(param.name)
        match = _BRACKET.search(help_text)
        if field is not None and getattr(baseline, param.name) is not None:
            assert match, f"--{param.name} overrides {field.name} but shows no default"
        if not match or (field is not None and getattr(baseline, param.name) is None):
            continue  # nothing shown, or a default described in words ([tile size])
        shown = match.group(1)
        # a --x/--no-x flag shows the side in effect; a value may be followed by " = why"
        args = ([f"--{shown}"] if param.secondary_opts
                else [param.opts[0], shown.split(" = ")[0]])
        assert _config(monkeypatch, name, args) == baseline, f"{name} {args}: {help_text}"
        checked += 1
    assert checked >= 1


def test_split_fractions_are_filled_from_the_config_and_checked_once(monkeypatch):
    config = _config(monkeypatch, "tupac16", ["--val", "0", "--test", "0.3"])
    assert config.fractions == {"train": 0.7, "val": 0.0, "test": 0.3}


def test_every_train_option_is_a_config_field_showing_its_default(monkeypatch):
    """capsmed train's options are generated from TrainConfig: typing a shown default
    builds the same config as leaving the option out, for every option."""
    import capsmed.train.engine as engine
    from capsmed.train.config import TrainConfig

    seen = []
    monkeypatch.setattr(engine, "train", lambda cfg, *a, **kw: seen.append(cfg) or "run")

    def config(*args):
        result = runner.invoke(app, ["train", "--data", "x.h5", "--arch", "lenet", *args])
        assert result.exit_code == 0, f"{args}: {result.output}"
        return seen[-1]

    baseline = config()
    command = typer.main.get_command(app).commands["train"]
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    checked = 0
    for param in command.params:
        if not isinstance(param, TyperOption) or param.name not in fields - {"data", "arch"}:
            continue  # data and arch are required: no default
        help_text = param.help or ""
        assert not param.show_default and "default:" not in help_text.lower(), help_text
        match = _BRACKET.search(help_text)
        if getattr(baseline, param.name) not in (None, {}, []):
            assert match, f"--{param.name} shows no default: {help_text}"
        if not match or getattr(baseline, param.name) in (None, {}, []):
            continue  # a default said in words ([the domain's ...])
        shown = match.group(1)
        args = [f"--{shown}"] if param.secondary_opts else [param.opts[0], shown]
        assert config(*args) == baseline, f"{args}: {help_text}"
        checked += 1
    assert checked >= 20
    assert {o.name for o in command.params} >= fields - {"model_kwargs"}
