"""A key given twice to a repeatable key=value option (``capsmed train --model-arg``,
``capsmed run --set``) is refused naming the key and both values: the last one
silently won, so a run trained with another option than the first one typed."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.faults.common import assert_refused, invoke
from tests.helpers import folder_dataset

SMOKE = Path(__file__).resolve().parents[1] / "pipelines" / "smoke.yaml"


def test_train_refuses_a_model_arg_given_twice(tmp_path):
    data = folder_dataset(tmp_path, images_per_class=4, patients=2)
    run = tmp_path / "run"
    assert_refused(invoke(["train", "--data", data, "--arch", "lenet", "--epochs", "1",
                           "--device", "cpu", "--model-arg", "widths=[3,4]",
                           "--model-arg", "hidden=[8]", "--model-arg", "widths=[5,6]",
                           "--out", run]),
                   "--model-arg widths", text="given twice ('[3,4]' and '[5,6]')",
                   absent=[run])


def test_run_refuses_a_variable_set_twice(tmp_path):
    raw = yaml.safe_load(SMOKE.read_text())
    raw["variables"]["out"] = str(tmp_path / "out")
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert_refused(invoke(["run", "--dry-run", pipeline, "--set", "epochs=1",
                           "--set", "epochs=3"]),
                   "--set epochs", text="given twice ('1' and '3')",
                   absent=[tmp_path / "out"])
