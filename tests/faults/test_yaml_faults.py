"""A key given twice in a YAML mapping is refused, naming the file and both lines:
PyYAML keeps the second silently (``epochs: 1`` then ``epochs: 3`` trained 3 epochs)."""

from __future__ import annotations

import pytest

from capsmed.errors import CapsmedError
from capsmed.yamlfile import load_yaml
from tests.faults.common import assert_refused, invoke, lenet_args


def test_a_repeated_key_is_refused_at_any_depth():
    assert load_yaml("a: 1\nb: {c: 2}\n", "x.yaml") == {"a": 1, "b": {"c": 2}}
    with pytest.raises(CapsmedError, match=r"x.yaml: line 3: key 'epochs' is given twice "
                                           r"in one mapping \(first on line 1\)"):
        load_yaml("epochs: 1\nlr: 0.1\nepochs: 3\n", "x.yaml")
    with pytest.raises(CapsmedError, match="line 4: key 'widths'"):
        load_yaml("model_kwargs:\n  widths: [3, 4]\n  hidden: [8]\n  widths: [5, 6]\n", "y")
    with pytest.raises(CapsmedError, match="line 1: key 'epochs' is given twice"):
        load_yaml("train: {epochs: 1, lr: 0.1, epochs: 3}\n", "w")  # one line, flow style
    # the same key in two mappings is fine
    assert load_yaml("- {a: 1}\n- {a: 2}\n", "z") == [{"a": 1}, {"a": 2}]


def test_train_refuses_a_config_file_with_a_repeated_option(toy_h5, tmp_path):
    config = tmp_path / "options.yaml"
    config.write_text("epochs: 1\nbatch_size: 8\nepochs: 3\n")
    out = tmp_path / "run"
    assert_refused(invoke(lenet_args(toy_h5, out, "--config", config)), config,
                   text="key 'epochs' is given twice", absent=[out])
