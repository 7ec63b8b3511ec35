"""capsmed predict under bad input: one error line naming the file, nothing written
(or, with --keep-going, the rest written and the failures listed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import pytest

from tests.faults.common import assert_refused, invoke


@pytest.fixture(scope="module")
def lenet_run(tiny_h5, tmp_path_factory):
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train

    out = tmp_path_factory.mktemp("predict-faults") / "run"
    return train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                             seed=0, out=str(out)), disable_progress=True)


@pytest.fixture
def images(tiny_raw, tmp_path):
    """Three TUPAC16 images and a corrupt one, in a folder of their own."""
    folder = tmp_path / "new"
    folder.mkdir()
    for i, tif in enumerate(sorted(tiny_raw.rglob("*.tif"))[:3]):
        shutil.copy(tif, folder / f"img{i}.tif")
    (folder / "img3.tif").write_bytes(b"II*\0" + b"\0" * 40)
    return folder


def predict_args(run, *inputs, out, extra=()):
    return ["predict", run, *inputs, "-o", out, "--device", "cpu", "--no-heatmaps", *extra]


def test_a_corrupt_image_stops_with_nothing_written(lenet_run, images, tmp_path):
    out = tmp_path / "out"
    assert_refused(invoke(predict_args(lenet_run, images, out=out)), images / "img3.tif",
                   absent=[out])


def test_keep_going_writes_the_rest_and_lists_the_failure(lenet_run, images, tmp_path):
    out = tmp_path / "out"
    result = invoke(predict_args(lenet_run, images, out=out, extra=["--keep-going"]))
    assert result.exit_code == 1
    assert "1 of 4 input(s) failed" in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [f["input"] for f in summary["failed"]] == [str(images / "img3.tif")]
    assert summary["inputs"] == 3 and summary["windows"] > 0
    assert len(list((out / "geojson").iterdir())) == 3


def test_a_run_without_its_preprocessing_record_is_refused(lenet_run, images, tmp_path,
                                                           tiny_h5):
    run = tmp_path / "old-run"
    shutil.copytree(lenet_run, run)
    (run / "preprocessing.json").unlink()
    meta = json.loads((run / "checkpoint.json").read_text())
    meta["data"] = str(tmp_path / "gone.h5")
    (run / "checkpoint.json").write_text(json.dumps(meta))
    out = tmp_path / "out"
    assert_refused(invoke(predict_args(run, images / "img0.tif", out=out)), run,
                   text="preprocessing the model was trained with is unknown", absent=[out])
    # --data names the dataset instead
    result = invoke(predict_args(run, images / "img0.tif", out=out,
                                 extra=["--data", tiny_h5]))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["preprocessing_from"] == str(tiny_h5)
    # ... but only the dataset the run was trained on
    other = tmp_path / "other.h5"
    shutil.copy(tiny_h5, other)
    with h5py.File(other, "a") as f:
        f.attrs["created"] = "2000-01-01T00:00:00+00:00"
    assert_refused(invoke(predict_args(run, images / "img0.tif", out=tmp_path / "o2",
                                       extra=["--data", other])), other,
                   text="not the data", absent=[tmp_path / "o2"])


@pytest.mark.parametrize("extra, names, text", [
    (["--class", "tumour"], "tumour", "classes: non-mitosis, mitosis"),
    (["--shape", "circle"], "--shape", "tile, point"),
    (["--batch-size", "0"], "--batch-size", ">= 1"),
    (["--stride", "0"], "--stride", ">= 1"),
    (["--min-tissue", "1.5"], "--min-tissue", "[0, 1]"),
    (["--fov-mask", "m.tif"], "--fov-mask", "diaretdb1 runs"),
    (["--threshold", "2"], "--threshold", "[0, 1]"),
    (["--threshold", "-0.1"], "--threshold", "[0, 1]"),
    (["--threshold", "nan"], "--threshold", "[0, 1]"),
])
def test_bad_options_are_refused(lenet_run, images, tmp_path, extra, names, text):
    out = tmp_path / "out"
    assert_refused(invoke(predict_args(lenet_run, images / "img0.tif", out=out, extra=extra)),
                   names, text=text, absent=[out])


@pytest.mark.parametrize("content, text", [
    ("file,x,y\na,1,2\n", "missing: input"),
    ("input,x,y\nimg0.tif,1.5,2\n", "line 2: x and y must be integers"),
    ("input,x,y\nimg0.tif,5000,2\n", "lies outside the 256x256 image"),
    ("input,x,y\nother.tif,5,5\n", "names input(s) not given: other.tif"),
    ("input,x,y\nimg0.tif,5,5\nimg0.tif,5,5\n", "line 3: the same window as line 2"),
])
def test_bad_centres_are_refused(lenet_run, images, tmp_path, content, text):
    centres = tmp_path / "centres.csv"
    centres.write_text(content)
    out = tmp_path / "out"
    result = invoke(predict_args(lenet_run, images / "img0.tif", out=out,
                                 extra=["--centres", centres]))
    assert_refused(result, "centres.csv" if "outside" not in text else "img0.tif", text=text,
                   absent=[out])


def test_an_existing_output_is_kept_unless_overwrite(lenet_run, images, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert_refused(invoke(predict_args(lenet_run, images / "img0.tif", out=out)), out,
                   text="not empty", unchanged={out / "keep.txt": b"mine"})
    result = invoke(predict_args(lenet_run, images / "img0.tif", out=out,
                                 extra=["--overwrite"]))
    assert result.exit_code == 0, result.output
    assert not (out / "keep.txt").exists() and (out / "predictions.csv").is_file()


def test_missing_inputs_and_a_folder_without_images_are_refused(lenet_run, tmp_path):
    out = tmp_path / "out"
    assert_refused(invoke(predict_args(lenet_run, tmp_path / "nope.tif", out=out)),
                   "nope.tif", text="no such input", absent=[out])
    (tmp_path / "empty").mkdir()
    assert_refused(invoke(predict_args(lenet_run, tmp_path / "empty", out=out)),
                   "empty", text="no input files", absent=[out])


def test_a_folder_that_is_not_a_run_is_refused(images, tmp_path):
    out = tmp_path / "out"
    result = invoke(predict_args(tmp_path, images / "img0.tif", out=out))
    assert result.exit_code == 1 and str(tmp_path) in result.stderr and not out.exists()


@pytest.mark.parametrize("where", ["input", "inside", "parent"])
def test_an_output_folder_among_the_inputs_is_refused(lenet_run, images, tmp_path, where):
    """The input folder itself, a folder inside it (a later run would read the outputs)
    or a folder holding it (--overwrite would delete the images): nothing touched."""
    (images / "img3.tif").unlink()
    out = {"input": images, "inside": images / "pred", "parent": tmp_path}[where]
    before = {p: p.read_bytes() for p in images.iterdir()}
    result = invoke(predict_args(lenet_run, images, out=out, extra=["--overwrite"]))
    text = "contains" if where == "parent" else "is (or lies inside) the input folder"
    assert_refused(result, out, text=text, unchanged=before)
    assert sorted(images.iterdir()) == sorted(before)


def test_level_on_a_plain_image_is_refused(lenet_run, images, tmp_path):
    out = tmp_path / "out"
    assert_refused(invoke(predict_args(lenet_run, images / "img0.tif", out=out,
                                       extra=["--level", "1"])), images / "img0.tif",
                   text="--level and --mpp apply to whole slides only", absent=[out])


def test_a_preprocessing_record_of_another_dataset_is_refused(lenet_run, images, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(lenet_run, run)
    record_path = run / "preprocessing.json"
    record = json.loads(record_path.read_text())
    # a record copied in from a run on a remade file (other patch size, same name)
    record["created"] = "2000-01-01T00:00:00+00:00"
    record_path.write_text(json.dumps(record))
    out = tmp_path / "out"
    assert_refused(invoke(predict_args(run, images / "img0.tif", out=out)), record_path,
                   text="its dataset created '2000-01-01T00:00:00+00:00' is not the",
                   absent=[out])


@pytest.mark.parametrize("suffix", [".png", ".tif", ".jpg"])
def test_a_greyscale_image_is_refused_by_a_colour_run_in_every_format(lenet_run, tmp_path,
                                                                      suffix):
    """An H&E run needs colour: a greyscale PNG or JPEG was read as grey copied to RGB and
    every window called mitosis, while a greyscale TIFF was refused."""
    import cv2
    import numpy as np

    grey = tmp_path / f"grey{suffix}"
    cv2.imwrite(str(grey), np.random.default_rng(0).integers(0, 255, (300, 300), np.uint8))
    out = tmp_path / "out"
    assert_refused(invoke(predict_args(lenet_run, grey, out=out)), grey,
                   text="expected an RGB image", absent=[out])


def test_a_rerun_removes_what_a_killed_predict_left(lenet_run, images, tmp_path):
    """kill -9 during predict leaves its staging folder (.<out>.XXXXXXXX.partial) beside
    the output; the next predict to the same -o removes it, and nothing else."""
    import tempfile

    out = tmp_path / "out"
    left = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=tmp_path))
    (left / "predictions.csv").write_text("input,x\n")
    keep = tmp_path / ".out.notours.partial"
    keep.mkdir()
    result = invoke(predict_args(lenet_run, images / "img0.tif", out=out))
    assert result.exit_code == 0, result.output
    assert not left.exists() and keep.is_dir() and (out / "summary.json").is_file()
    assert not (tmp_path / ".out.lock").exists()
