"""capsmed predict, more: what summary.json and the terminal table claim for a run that
predicts one class per image."""

from __future__ import annotations

import json

import pytest

from capsmed.errors import CapsmedError
from capsmed.predict.config import PredictOptions
from capsmed.predict.engine import predict
from capsmed.predict.report import summary_table
from tests.helpers import folder_lenet


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    return folder_lenet(tmp_path_factory.mktemp("more-folder"))


def test_an_image_level_summary_claims_no_class_threshold_or_positives(folder_run,
                                                                        tmp_path):
    run, files = folder_run
    done = predict(run, files, tmp_path / "out", PredictOptions(device="cpu"))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    # "positives: 0" of the second class at 0.5 would read as a finding about the images
    for key in ("class", "class_index", "threshold", "geojson_shape", "positives"):
        assert summary[key] is None, key
    assert summary["decision"] == "an image's prediction is its highest-scoring class"
    assert sum(summary["predicted_counts"].values()) == summary["inputs"] == len(files)
    table = summary_table(done)
    assert "positives:" not in table.title
    assert table.rows[-1][2] == "-"


def test_shape_is_refused_for_an_image_level_run_not_ignored(folder_run, tmp_path):
    run, files = folder_run
    with pytest.raises(CapsmedError, match="--shape applies to patch and slide runs"):
        predict(run, files[:1], tmp_path / "out", PredictOptions(device="cpu",
                                                                 shape="point"))
    assert not (tmp_path / "out").exists()
