"""capsmed predict: the training preprocessing replayed on raw files gives exactly the
dataset's patches, so its scores are bit-equal to evaluate's on the same samples."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import load_split
from capsmed.data.sources.diaretdb1.config import Diaretdb1Config
from capsmed.data.sources.diaretdb1.reader import preprocess_diaretdb1
from capsmed.data.sources.diaretdb1.synth import write_diaretdb1
from capsmed.predict.config import Overrides, PredictOptions
from capsmed.predict.engine import predict
from capsmed.runs import open_run
from capsmed.runs.scores import class_probabilities, predict_scores
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train
from tests.helpers import TINY_CAPSNET

runner = CliRunner()
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tupac_runs(tiny_h5, tmp_path_factory):
    """A LeNet (softmax scores) and a tiny CapsNet (capsule lengths) on ``tiny_h5``."""
    root = tmp_path_factory.mktemp("predict-runs")
    lenet = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                              seed=1, out=str(root / "lenet")), disable_progress=True)
    capsnet = train(TrainConfig(data=str(tiny_h5), arch="capsnet", epochs=1, batch_size=16,
                                seed=1, model_kwargs=dict(TINY_CAPSNET),
                                out=str(root / "capsnet")), disable_progress=True)
    return {"lenet": lenet, "capsnet": capsnet}


def _evaluate_scores(run_dir: Path, data: Path, batch_size: int, with_meta: bool = True):
    """What ``capsmed evaluate`` scores: its samples (with the split's meta, when the
    run tests on a whole split), through its scoring function."""
    run = open_run(run_dir, data, CPU)
    split, model, meta = run.samples("test"), run.model, run.meta
    raw = predict_scores(model, split.images, CPU, batch_size)
    if with_meta:
        whole = load_split(data, "test", with_meta=True)  # the same rows, and where from
        assert np.array_equal(split.images, whole.images)
        split = whole
    return split, class_probabilities(raw, meta["loss_kind"])[0]


def _centres_csv(path: Path, raw_dir: Path, split) -> list[Path]:
    """The split's window centres as predict's --centres CSV; the inputs in split order."""
    sources = split.meta["source"]
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["input", "x", "y"])
        for source, row, col in zip(sources, split.meta["row"], split.meta["col"], strict=True):
            out.writerow([str(raw_dir / source), int(col), int(row)])
    return [raw_dir / s for s in dict.fromkeys(sources)]


def _predicted(result) -> np.ndarray:
    return np.concatenate([r.scores for r in result.results])


@pytest.mark.parametrize("arch", ["lenet", "capsnet"])
def test_tupac16_predict_on_raw_images_equals_evaluate_bit_for_bit(tupac_runs, tiny_raw,
                                                                    tiny_h5, tmp_path, arch):
    run_dir = tupac_runs[arch]
    split, expected = _evaluate_scores(run_dir, tiny_h5, batch_size=6)
    inputs = _centres_csv(tmp_path / "centres.csv", tiny_raw, split)
    # several images, several batches, a batch spanning two images
    assert len(inputs) >= 2 and len(split) > 6 and len(split) % 6
    result = predict(run_dir, inputs, tmp_path / "out", PredictOptions(
        centres=tmp_path / "centres.csv", batch_size=6, device="cpu", heatmaps=False))
    got = _predicted(result)
    assert got.shape == expected.shape and np.ptp(expected[:, 1]) > 0
    assert np.array_equal(got, expected)  # bit-equal, not close
    xs = np.concatenate([r.x for r in result.results])
    assert np.array_equal(xs, split.meta["col"])
    # the CSV holds the same windows and scores
    with open(tmp_path / "out" / "predictions.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(split)
    assert np.allclose([float(r["score_mitosis"]) for r in rows], expected[:, 1], rtol=1e-5)


def test_another_h_max_changes_the_scores(tupac_runs, tiny_raw, tiny_h5, tmp_path):
    """The control: the equality above needs the recorded preprocessing."""
    run_dir = tupac_runs["lenet"]
    split, expected = _evaluate_scores(run_dir, tiny_h5, batch_size=16)
    inputs = _centres_csv(tmp_path / "centres.csv", tiny_raw, split)
    record = json.loads((run_dir / "preprocessing.json").read_text())
    record["preprocessing"]["h_max"] *= 2
    other = tmp_path / "run"
    other.mkdir()
    for name in ("checkpoint.json", "checkpoint.safetensors"):
        (other / name).write_bytes((run_dir / name).read_bytes())
    (other / "preprocessing.json").write_text(json.dumps(record))
    result = predict(other, inputs, tmp_path / "out", PredictOptions(
        centres=tmp_path / "centres.csv", batch_size=16, device="cpu", heatmaps=False))
    assert not np.allclose(_predicted(result), expected)


def test_diaretdb1_predict_on_raw_photographs_equals_evaluate(tmp_path, caplog):
    raw = tmp_path / "ddb1"
    write_diaretdb1(raw, images=6, size=(320, 256), seed=2, disable_progress=True)
    data = preprocess_diaretdb1(raw, tmp_path / "d.h5", Diaretdb1Config(
        patch_size=64, stride=32, workers=1, val_fraction=0.3), disable_progress=True)
    run_dir = train(TrainConfig(data=str(data), arch="lenet", epochs=1, batch_size=16, seed=0,
                                out=str(tmp_path / "run")), disable_progress=True)
    split, expected = _evaluate_scores(run_dir, data, batch_size=32)
    inputs = _centres_csv(tmp_path / "centres.csv", raw, split)
    fov = raw / "resources/images/ddb1_fundusmask/fmask.tif"
    result = predict(run_dir, inputs, tmp_path / "out", PredictOptions(
        centres=tmp_path / "centres.csv", batch_size=32, device="cpu",
        overrides=Overrides(fov_mask=fov), heatmaps=False))
    assert np.array_equal(_predicted(result), expected) and np.ptp(expected[:, 1]) > 0
    assert "field of view is estimated" not in caplog.text
    # the estimate moves the soft rim by a pixel, and every patch with it: said once
    from capsmed.data.replay import make_recipe

    make_recipe(open_run(run_dir, None, CPU, need_data=False).record(), Overrides())
    said = "pass --fov-mask (fov_mask= in Python) to see them as training did"
    assert caplog.text.count(said) == 1


def test_predict_on_a_folder_writes_csv_heatmaps_geojson_and_summary(tupac_runs, tiny_raw,
                                                                     tmp_path):
    out = tmp_path / "pred"
    result = runner.invoke(app, ["-q", "predict", str(tupac_runs["lenet"]), str(tiny_raw),
                                 "-o", str(out), "--device", "cpu", "--threshold", "0"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["inputs"] == 10 and summary["failed"] == []
    assert summary["windows"] == summary["positives"] > 0  # threshold 0: every window
    assert sorted(p.name for p in (out / "heatmaps").iterdir())[0] == "01_01.png"
    assert len(list((out / "geojson").iterdir())) == 10
    features = json.loads((out / "geojson" / "01_01.geojson").read_text())["features"]
    assert features and features[0]["properties"]["classification"]["name"] == "mitosis"
    with open(out / "predictions.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == summary["windows"]
    assert {r["predicted"] for r in rows} == {"mitosis"}  # threshold 0 calls every window
    # the highest threshold (no softmax of these windows reaches 1): empty
    # FeatureCollections, still one per input
    assert max(float(r["score_mitosis"]) for r in rows) < 1
    high = runner.invoke(app, ["-q", "predict", str(tupac_runs["lenet"]), str(tiny_raw),
                               "-o", str(tmp_path / "high"), "--device", "cpu",
                               "--threshold", "1", "--no-heatmaps"])
    assert high.exit_code == 0, high.output
    assert not (tmp_path / "high" / "heatmaps").exists()
    empty = json.loads((tmp_path / "high" / "geojson" / "01_01.geojson").read_text())
    assert empty == {"type": "FeatureCollection", "features": []}


def test_a_capsnets_csv_geojson_and_counts_call_the_same_windows(tupac_runs, tiny_raw,
                                                                  tmp_path):
    """Issue 23: capsule lengths are independent, so both classes of a window can exceed
    0.5; GeoJSON 'mitosis' detections had predicted=non-mitosis in the CSV. The called
    class at --threshold decides the CSV, the GeoJSON and the counts alike."""
    out = tmp_path / "pred"
    result = runner.invoke(app, ["-q", "predict", str(tupac_runs["capsnet"]), str(tiny_raw),
                                 "-o", str(out), "--device", "cpu", "--threshold", "0.3",
                                 "--no-heatmaps"])
    assert result.exit_code == 0, result.output
    with open(out / "predictions.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    called = [float(r["score_mitosis"]) >= 0.3 for r in rows]
    assert [r["predicted"] == "mitosis" for r in rows] == called
    assert 0 < sum(called) < len(rows)
    features = [f for path in (out / "geojson").iterdir()
                for f in json.loads(path.read_text())["features"]]
    assert len(features) == sum(called) == json.loads(
        (out / "summary.json").read_text())["positives"]


def test_predict_works_after_the_dataset_file_is_gone(tupac_runs, tiny_h5, tiny_raw,
                                                      tmp_path):
    run_dir = tupac_runs["lenet"]
    moved = tmp_path / "moved.h5"
    tiny_h5.rename(moved)
    try:
        result = predict(run_dir, [tiny_raw / "mitoses_image_data_part_1"], tmp_path / "out",
                         PredictOptions(device="cpu", heatmaps=False))
    finally:
        moved.rename(tiny_h5)
    assert result.results and result.per_input[0]["windows"] > 0


def test_the_estimated_field_of_view_matches_the_released_mask(tmp_path):
    from capsmed.data.sources.diaretdb1.layout import read_fundus_mask, read_rgb_png
    from capsmed.data.sources.diaretdb1.recipe import estimate_fov

    raw = tmp_path / "ddb1"
    write_diaretdb1(raw, images=2, size=(320, 256), seed=5, disable_progress=True)
    mask = read_fundus_mask(raw / "resources/images/ddb1_fundusmask/fmask.tif")
    for png in sorted((raw / "resources/images/ddb1_fundusimages").glob("*.png")):
        fov = estimate_fov(read_rgb_png(png))
        iou = (fov & mask).sum() / (fov | mask).sum()
        assert iou > 0.95, (png.name, iou)
    assert not estimate_fov(np.zeros((32, 32, 3), np.uint8)).any()


def test_inputs_get_distinct_output_names(tmp_path):
    from capsmed.predict.inputs import gather_inputs

    for case in ("01", "02"):
        (tmp_path / "a" / case).mkdir(parents=True)
        (tmp_path / "a" / case / "01.tif").write_bytes(b"x")
    (tmp_path / "b" / "01").mkdir(parents=True)
    (tmp_path / "b" / "01" / "01.png").write_bytes(b"x")
    items = gather_inputs([tmp_path / "a", tmp_path / "b", tmp_path / "a" / "01" / "01.tif"],
                          slides=False)
    assert [i.stem for i in items] == ["01_01", "02_01", "01_01-2"]  # the repeat is dropped


def test_a_light_digit_image_is_warned_about(tmp_path, caplog):
    import cv2

    from capsmed.data.record import DatasetRecord
    from capsmed.data.replay import make_recipe
    from capsmed.data.replay.options import Overrides

    record = DatasetRecord("mnist", tuple("0123456789"), 1, (28, 28), {"seed": 0})
    recipe = make_recipe(record, Overrides())
    dark, light = np.zeros((56, 56), np.uint8), np.full((56, 56), 255, np.uint8)
    dark[20:36, 26:30] = light[20:36, 26:30] = 128
    for name, image in (("dark.png", dark), ("light.png", light)):
        cv2.imwrite(str(tmp_path / name), image)
        prepared = recipe.prepare(tmp_path / name, None)
        images, centres = next(prepared.chunks)
        assert images.shape == (1, 1, 28, 28) and centres.tolist() == [[28, 28]]
    assert "light.png: mostly light" in caplog.text and "dark.png" not in caplog.text


@pytest.mark.parametrize("placement", ["center40", "random40"])
def test_a_digit_is_placed_on_the_canvas_as_the_set_placed_its_digits(tmp_path, placement):
    """A run on MNIST placed on 40x40 gets a 28x28 digit centred on the black canvas,
    as center40 made the set (it was stretched to fill the canvas)."""
    import cv2

    from capsmed.data.record import DatasetRecord
    from capsmed.data.replay import make_recipe
    from capsmed.data.replay.options import Overrides

    record = DatasetRecord("mnist", tuple("0123456789"), 1, (40, 40),
                           {"seed": 0, "placement": placement, "canvas": 40,
                            "source_image_size": [28, 28]})
    recipe = make_recipe(record, Overrides())
    digit = np.zeros((28, 28), np.uint8)
    digit[4:24, 12:16] = 200
    cv2.imwrite(str(tmp_path / "digit.png"), digit)
    images, _ = next(recipe.prepare(tmp_path / "digit.png", None).chunks)
    expected = np.zeros((40, 40), np.uint8)
    expected[6:34, 6:34] = digit
    np.testing.assert_array_equal(images[0, 0], expected)
    cv2.imwrite(str(tmp_path / "big.png"), cv2.resize(digit, (56, 56)))  # resized first
    images, _ = next(recipe.prepare(tmp_path / "big.png", None).chunks)
    assert images[0, 0, :6].max() == 0 and images[0, 0, 6:34, 6:34].max() > 0


def test_another_data_file_is_refused_for_a_run_with_its_own_record(tupac_runs, tiny_h5,
                                                                    tiny_raw, tmp_path):
    """--data is for runs without preprocessing.json: for a run with one, another file
    (another stain normalisation of the same classes, say) was accepted and ignored."""
    import shutil

    import h5py

    from tests.helpers import assert_clean_failure

    run_dir = tupac_runs["lenet"]
    other = tmp_path / "other.h5"
    shutil.copy(tiny_h5, other)
    with h5py.File(other, "a") as f:
        f.attrs["note"] = "made otherwise"  # same classes and images: another file
    inputs = [str(tiny_raw / "mitoses_image_data_part_1")]
    out = tmp_path / "out"
    result = runner.invoke(app, ["predict", str(run_dir), *inputs, "-o", str(out),
                                 "--data", str(other), "--no-heatmaps", "--device", "cpu"])
    assert_clean_failure(result, "--data is for runs without preprocessing.json", out)
    result = runner.invoke(app, ["predict", str(run_dir), *inputs, "-o", str(out),
                                 "--data", str(tiny_h5), "--no-heatmaps", "--device", "cpu"])
    assert result.exit_code == 0, result.output  # the run's own file: as without --data
