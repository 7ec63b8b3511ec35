"""A key given twice in a YAML mapping is refused, naming the file and both lines:
PyYAML keeps the second silently (``epochs: 1`` then ``epochs: 3`` trained 3 epochs).
So is a plain value YAML 1.1 reads as another than it shows: ``seed: 010`` (octal 8),
a grid value ``no`` (false, labelled 'False'), ``time_min: 12:00:00`` (base 60: 43200)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

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


MISREAD = {  # YAML text: (where, what the error says), each once read as another value
    "seed: 010\n": ("line 1 (seed)", "010 reads as the octal number 8, not 10"),
    "train:\n  epochs: +0_12\n": ("line 2 (train.epochs)", "octal number 10, not 12"),
    "grid:\n  - condition: [full, no]\n": ("line 2 (grid[0].condition[1])",
                                           "no reads as false"),
    "imbalance: {Off: 50}\n": ("line 1 (a key of imbalance)", "Off reads as false"),
    "augment: on\n": ("line 1 (augment)", "on reads as true: write true"),
    "resources: {time_min: 12:00:00}\n": ("line 1 (resources.time_min)", "base-60"),
    "lr: 1:30.5\n": ("line 1 (lr)", "base-60"),
}


@pytest.mark.parametrize("text", MISREAD, ids=range(len(MISREAD)))
def test_a_value_yaml_reads_as_another_is_refused(text):
    where, what = MISREAD[text]
    with pytest.raises(CapsmedError) as err:
        load_yaml(text, "x.yaml")
    message = str(err.value)
    assert message.startswith(f"x.yaml: {where}: ") and what in message, message
    assert "\n" not in message


def test_values_read_as_written_are_kept():
    text = ("a: ['no', \"off\", '010', '1:30', true, FALSE, 07, 0, 1_000, 0x10, 1.0e-3, y, n]"
            "\nb: |\n  no\n")
    assert load_yaml(text, "x") == {"a": ["no", "off", "010", "1:30", True, False, 7, 0,
                                          1000, 16, 0.001, "y", "n"], "b": "no\n"}
    # what capsmed writes (config.yaml, pipeline state) reads back as it was
    saved = {"classes": ["no", "On"], "seed": "010", "time": "1:30", "x": [True, 8]}
    assert load_yaml(yaml.safe_dump(saved), "config.yaml") == saved


def test_train_refuses_an_octal_seed_in_a_config_file(toy_h5, tmp_path):
    config = tmp_path / "options.yaml"
    config.write_text("epochs: 1\nseed: 010\n")
    out = tmp_path / "run"
    assert_refused(invoke(lenet_args(toy_h5, out, "--config", config)), config,
                   text="line 2 (seed): YAML 1.1 010 reads as the octal number 8",
                   absent=[out])


SMOKE = Path(__file__).resolve().parents[2] / "pipelines" / "smoke.yaml"


def _pipeline(tmp_path: Path, old: str, new: str) -> Path:
    text = SMOKE.read_text().replace("out: runs/smoke", f"out: {tmp_path / 'out'}")
    assert old in text
    path = tmp_path / "p.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_run_refuses_a_grid_value_yaml_reads_as_a_boolean(tmp_path):
    pipeline = _pipeline(tmp_path, "condition: [full, half]", "condition: [yes, no]")
    assert_refused(invoke(["run", "--dry-run", pipeline]), pipeline,
                   text="(grid[0].condition[0]): YAML 1.1 yes reads as true",
                   absent=[tmp_path / "out"])


def test_run_refuses_an_octal_set_value_or_environment_variable(tmp_path, monkeypatch):
    pipeline = _pipeline(tmp_path, "seed: [0, 1]", 'seed: "{seeds}"')
    pipeline.write_text(pipeline.read_text().replace("epochs: 1\n", "epochs: 1\n  seeds: [0, 1]\n"))
    assert_refused(invoke(["run", "--dry-run", pipeline, "--set", "seeds=[0, 1, 010]"]),
                   "--set seeds", text="([2]): YAML 1.1 010 reads as the octal number 8",
                   absent=[tmp_path / "out"])
    monkeypatch.setenv("CAPSMED_EPOCHS", "010")
    assert_refused(invoke(["run", "--dry-run", pipeline]), "CAPSMED_EPOCHS",
                   text="010 reads as the octal number 8", absent=[tmp_path / "out"])


def test_run_refuses_a_set_value_that_is_not_yaml_in_one_line(tmp_path):
    pipeline = _pipeline(tmp_path, "epochs: 1\n", "epochs: 1\n")
    assert_refused(invoke(["run", "--dry-run", pipeline, "--set", "epochs=[1"]),
                   "--set epochs", text="'[1' is not a valid YAML value",
                   absent=[tmp_path / "out"])
