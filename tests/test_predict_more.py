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


def test_an_unfinished_run_predicts_with_a_warning(folder_run, tmp_path, caplog):
    """As evaluate, export and the analyses warn: the checkpoint is of an intermediate
    epoch while resume.pt is there."""
    import shutil

    run, files = folder_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    predict(copy, files[:1], tmp_path / "done", PredictOptions(device="cpu"))
    assert "has not finished" not in caplog.text
    (copy / "resume.pt").write_bytes(b"")  # training in progress (predict does not read it)
    predict(copy, files[:1], tmp_path / "out", PredictOptions(device="cpu"))
    assert "its training has not finished (resume.pt is there), so this predicts with " \
           "the epoch 1 checkpoint" in " ".join(caplog.text.split())


def test_an_input_with_an_exif_orientation_is_warned_about(folder_run, tmp_path, caplog):
    """As preprocess warns about its images: predict scores a phone photo stored
    sideways (Orientation 6) as its pixels lie, which a viewer shows turned upright."""
    from PIL import Image

    run, files = folder_run
    exif = Image.Exif()
    exif[0x0112] = 6
    with Image.open(files[0]) as image:
        image.save(tmp_path / "turned.jpg", exif=exif)
        image.save(tmp_path / "upright.jpg")
    with caplog.at_level("WARNING"):
        predict(run, [tmp_path / "upright.jpg"], tmp_path / "a", PredictOptions(device="cpu"))
        assert "EXIF orientation" not in caplog.text
        predict(run, [tmp_path / "turned.jpg", tmp_path / "upright.jpg"], tmp_path / "b",
                PredictOptions(device="cpu"))
    assert "1 input(s) carry an EXIF orientation (turned.jpg) that is not applied" \
        in caplog.text
