"""The public Python API (capsmed.preprocess, train_run, evaluate_run, load_run,
predict_inputs, export_run) and
capsmed export: every format loads back outside capsmed's code and gives the scores
capsmed itself reports, with the classes and preprocessing as metadata."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import capsmed
from capsmed.data.contract import load_split
from capsmed.errors import CapsmedError
from capsmed.runs.export import load_exported
from tests.faults.common import assert_refused, invoke
from tests.helpers import TINY, folder_dataset


@pytest.fixture(scope="module")
def api_run(tmp_path_factory):
    """A class-folder set and a tiny lenet and capsnet trained on it, all through the
    public API."""
    work = tmp_path_factory.mktemp("api")
    data = folder_dataset(work)
    runs = {arch: capsmed.train_run(data, arch, epochs=1, batch_size=8, seed=0, device="cpu",
                                out=str(work / arch), model_kwargs=TINY[arch])
            for arch in ("lenet", "capsnet")}
    return data, runs


def test_the_api_trains_evaluates_and_predicts_on_arrays(api_run):
    data, runs = api_run
    report = capsmed.evaluate_run(runs["lenet"], grids=False, disable_progress=True).report
    test = load_split(data, "test")
    run = capsmed.load_run(runs["lenet"])
    scores = run.predict(test.images)
    assert scores.shape == (len(test), 3) and np.allclose(scores.sum(axis=1), 1)
    assert run.class_names == ("circle", "square", "triangle")
    predicted = scores.argmax(axis=1)
    assert report.accuracy == pytest.approx(float((predicted == test.labels).mean()))
    # one image [C, H, W] is a batch of one; a batch of one and a batch of many can
    # differ in float32's last bits (the CPU's kernels depend on the batch)
    assert np.array_equal(run.predict(test.images[0]), run.predict(test.images[:1]))
    np.testing.assert_allclose(run.predict(test.images[0]), scores[:1], rtol=0, atol=1e-6)
    with pytest.raises(CapsmedError, match=r"uint8 images \[N, 1x28x28\]"):
        run.predict(test.images.astype(np.float32))
    with pytest.raises(CapsmedError, match="got uint8 \\[2, 1, 32, 32\\]"):
        run.predict(np.zeros((2, 1, 32, 32), np.uint8))


@pytest.mark.parametrize("fmt", ["torchscript", "exported-program"])
def test_an_exported_model_gives_the_runs_scores_with_its_metadata(api_run, tmp_path, fmt):
    data, runs = api_run
    test = load_split(data, "test")
    for arch, run_dir in runs.items():
        path = capsmed.export_run(run_dir, tmp_path / f"{arch}.{fmt}", format=fmt)
        forward, meta = load_exported(path, fmt)
        got = forward(test.images.astype(np.float32) / 255.0)
        assert np.allclose(got, capsmed.load_run(run_dir).predict(test.images), atol=1e-5)
        assert meta["class_names"] == ["circle", "square", "triangle"] and meta["arch"] == arch
        assert meta["input"]["shape"] == [1, 28, 28]
        assert meta["preprocessing"]["source_kind"] == "folder"
        assert meta["preprocessing"]["parameters"]["size"] == 28


@pytest.mark.slow
def test_onnx_runs_in_onnx_runtime_with_the_runs_scores(api_run, tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    data, runs = api_run
    test = load_split(data, "test")
    for arch, run_dir in runs.items():
        result = invoke(["export", run_dir, "-o", tmp_path / f"{arch}.onnx"])
        assert result.exit_code == 0, result.output
        forward, meta = load_exported(tmp_path / f"{arch}.onnx", "onnx")
        got = forward(test.images.astype(np.float32) / 255.0)
        assert np.allclose(got, capsmed.load_run(run_dir).predict(test.images), atol=1e-5)
        props = {p.key: p.value for p in onnx.load(str(tmp_path / f"{arch}.onnx")
                                                   ).metadata_props}
        assert json.loads(props["capsmed"])["class_names"] == meta["class_names"]
    # as a user runs it: torch's exporter's warnings (torchvision operators capsmed does
    # not use, each a 130-column line) are not shown
    done = subprocess.run([sys.executable, "-m", "capsmed", "export", str(runs["lenet"]),
                           "-o", str(tmp_path / "cli.onnx")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "torchvision" not in done.stderr
    assert all(len(line) <= 80 or str(tmp_path) in line  # a long path is kept whole
               for line in (done.stdout + done.stderr).splitlines())


def test_export_refuses_bad_requests(api_run, tmp_path):
    _, runs = api_run
    out = tmp_path / "m.onnx"
    assert_refused(invoke(["export", runs["lenet"], "-o", out, "--format", "keras"]),
                   "--format", text="onnx, torchscript, exported-program", absent=[out])
    out.write_text("keep")
    assert_refused(invoke(["export", runs["lenet"], "-o", out, "--format", "torchscript"]),
                   out, text="--overwrite", unchanged={out: b"keep"})
    other = tmp_path / "m.pt"
    assert_refused(invoke(["export", tmp_path, "-o", other, "--format", "torchscript"]),
                   tmp_path, absent=[other])
    # ONNX under a TorchScript name would fail where it is loaded
    assert_refused(invoke(["export", runs["lenet"], "-o", other, "--format", "onnx"]),
                   other, text="its suffix .pt names torchscript, but --format is onnx",
                   absent=[other])


def test_an_output_naming_a_folder_is_refused_with_a_file_name_to_give(api_run, tmp_path,
                                                                      monkeypatch):
    """``-o exports/`` wrote the model to a file named ``exports`` (Path drops the
    "/"); an existing folder was refused without saying what to give instead."""
    _, runs = api_run
    monkeypatch.chdir(tmp_path)
    assert_refused(invoke(["export", runs["lenet"], "-o", "exports/", "--format",
                           "torchscript"]), "exports/", text="such as exports/model.pt",
                   absent=[tmp_path / "exports"])
    (tmp_path / "made").mkdir()
    assert_refused(invoke(["export", runs["lenet"], "-o", "made"]), "made",
                   text="such as made/model.onnx", absent=[tmp_path / "made"])
    with pytest.raises(CapsmedError, match="such as exports/model.pt2"):
        capsmed.export_run(runs["lenet"], "exports/", format="exported-program")
    assert not (tmp_path / "exports").exists()


def test_onnx_without_onnx_runtime_is_refused_in_one_line(api_run, tmp_path, monkeypatch):
    """The ONNX file is checked in ONNX Runtime: with onnx and onnxscript but not
    onnxruntime, the export ran, then the check died with a ModuleNotFoundError
    traceback instead of saying what to install."""
    _, runs = api_run
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if absent
    out = tmp_path / "m.onnx"
    assert_refused(invoke(["export", runs["lenet"], "-o", out]), "--format onnx",
                   text="onnxruntime: pip install 'capsmed[export]'", absent=[out])


def test_the_format_follows_the_file_name_when_not_given(api_run, tmp_path, caplog):
    _, runs = api_run
    with caplog.at_level("WARNING"):
        result = invoke(["export", runs["lenet"], "-o", tmp_path / "m.pt2"])
    assert result.exit_code == 0, result.output
    # the temporary file beside m.pt2 does not end in .pt2: torch warned "Unable to load
    # package" of it, on a successful export
    assert not [r.getMessage() for r in caplog.records if ".pt2" in r.getMessage()]
    _, meta = load_exported(tmp_path / "m.pt2", "exported-program")
    assert meta["arch"] == "lenet"


def test_an_unfinished_runs_export_says_so(tmp_path, caplog):
    """An interrupted run's checkpoint is of an intermediate epoch: the export warns, as
    evaluate does, and its metadata records it (a finished run's says finished)."""
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train
    from capsmed.train.loop import TrainingInterrupted
    from tests.faults.common import TINY_LENET
    from tests.faults.conftest import write_toy

    toy = write_toy(tmp_path / "toy.h5")
    cfg = TrainConfig(data=str(toy), arch="lenet", epochs=3, batch_size=16, seed=0,
                      out=str(tmp_path / "run"), model_kwargs=TINY_LENET,
                      state_every_minutes=0)
    with pytest.raises(TrainingInterrupted):
        train(cfg, disable_progress=True, stop_after_steps=4)  # inside epoch 2 of 3
    with caplog.at_level("WARNING", logger="capsmed"):
        path = capsmed.export_run(tmp_path / "run", tmp_path / "m.pt", format="torchscript")
    _, meta = load_exported(path, "torchscript")
    assert meta["training_finished"] is False and meta["checkpoint_epoch"] == 1
    assert any("has not finished" in r.getMessage() for r in caplog.records)


def test_a_finished_runs_export_says_finished(api_run, tmp_path):
    _, runs = api_run
    path = capsmed.export_run(runs["lenet"], tmp_path / "m.pt", format="torchscript")
    assert load_exported(path, "torchscript")[1]["training_finished"] is True


def test_the_metadata_says_whether_the_model_standardises(api_run, tmp_path):
    """A run trained without standardisation was described as standardising "inside the
    model", beside null statistics."""
    data, runs = api_run
    plain = capsmed.train_run(data, "lenet", epochs=1, batch_size=8, seed=0, device="cpu",
                              out=str(tmp_path / "plain"), model_kwargs=TINY["lenet"],
                              standardize=False)
    meta = {}
    for name, run_dir in (("standardised", runs["lenet"]), ("plain", plain)):
        path = capsmed.export_run(run_dir, tmp_path / f"{name}.pt", format="torchscript")
        meta[name] = load_exported(path, "torchscript")[1]
    assert meta["standardised"]["input"]["standardisation"].startswith("inside the model")
    assert meta["standardised"]["input_mean"] is not None
    assert meta["plain"]["input_mean"] is None
    assert meta["plain"]["input"]["standardisation"].startswith("none")
