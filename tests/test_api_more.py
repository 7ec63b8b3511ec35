"""The public Python API gives what the matching command gives: the same file for the
same source and options, the same refusals."""

from __future__ import annotations

import numpy as np
import pytest

import capsmed
from capsmed.data.contract import read_info
from capsmed.errors import CapsmedError


def test_preprocess_fashion_mnist_writes_fashion_mnist(tmp_path):
    """``capsmed.preprocess("fashion-mnist", ...)`` shares MnistConfig with mnist, whose
    default dataset is mnist: the file was written with digit classes 0-9."""
    from capsmed.data.sources.mnist.synth import write_mnist_like

    write_mnist_like(tmp_path / "raw", "fashion-mnist", train=30, test=10, seed=0)
    out = capsmed.preprocess("fashion-mnist", tmp_path / "raw", tmp_path / "f.h5", val=5)
    info = read_info(out)
    assert info.class_names[0] == "T-shirt/top" and info.source_kind == "fashion-mnist"
    with pytest.raises(CapsmedError, match="dataset='fashion-mnist' contradicts the "
                       "source 'mnist'"):
        capsmed.preprocess("mnist", tmp_path / "raw", tmp_path / "m.h5",
                           dataset="fashion-mnist")
    assert not (tmp_path / "m.h5").exists()


def test_nan_scores_are_refused_by_load_run_predict_array_and_export(tmp_path):
    """A checkpoint pair whose weights hold a NaN gives NaN scores: ``capsmed predict``
    and evaluate refuse them, but ``load_run(...).predict`` and ``predict_array``
    returned them (argmax: class 0 for every image); export said 'does not reproduce'."""
    import cv2
    import torch

    from capsmed.runs.checkpoint import load_checkpoint
    from capsmed.train.checkpoint import save_checkpoint
    from tests.helpers import folder_lenet

    run_dir, images = folder_lenet(tmp_path)
    model, meta = load_checkpoint(run_dir)
    with torch.no_grad():
        next(model.parameters())[0].fill_(float("nan"))
    save_checkpoint(run_dir, model, {k: v for k, v in meta.items() if k != "weights_digest"})
    run = capsmed.load_run(run_dir)
    nan = "checkpoint.safetensors: the model gives NaN or infinite class scores for"
    with pytest.raises(CapsmedError, match=f"{nan} 2 of 2 images scored"):
        run.predict(np.zeros((2, *run.input_shape), np.uint8))
    with pytest.raises(CapsmedError, match=nan):
        capsmed.predict_array(run, cv2.imread(str(images[0]), cv2.IMREAD_GRAYSCALE))
    with pytest.raises(CapsmedError, match=f"{nan} 3 of 3 random images"):
        capsmed.export_run(run_dir, tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()


@pytest.fixture(scope="module")
def lenet_run(tmp_path_factory):
    from tests.helpers import folder_lenet

    return folder_lenet(tmp_path_factory.mktemp("api-lenet"))[0]


def test_load_run_and_predict_array_warn_of_an_unfinished_run(lenet_run, tmp_path, caplog):
    """``capsmed predict`` and export warn when resume.pt is there (the checkpoint is
    of an intermediate epoch); ``load_run`` and ``predict_array`` scored it silently."""
    import shutil

    run_dir = lenet_run
    image = np.full((40, 40), 200, np.uint8)
    capsmed.predict_array(capsmed.load_run(run_dir), image)
    assert "has not finished" not in caplog.text
    unfinished = tmp_path / "unfinished"
    shutil.copytree(run_dir, unfinished)
    (unfinished / "resume.pt").write_bytes(b"")  # training in progress
    run = capsmed.load_run(unfinished)
    assert "its training has not finished (resume.pt is there), so this loads the " \
           "epoch 1 checkpoint" in " ".join(caplog.text.split())
    caplog.clear()
    capsmed.predict_array(unfinished, image)
    assert "so this predicts with the epoch 1 checkpoint" in " ".join(caplog.text.split())
    caplog.clear()
    capsmed.predict_array(run, image)  # load_run has said it
    assert "has not finished" not in caplog.text


def test_load_run_warns_of_a_stopped_run_whose_resume_state_was_deleted(lenet_run, tmp_path,
                                                                        caplog):
    """Neither resume.pt (deleted: it is large) nor summary.json: the checkpoint is of
    the epoch training stopped at, and load_run and predict_array said nothing."""
    import shutil

    stopped = tmp_path / "stopped"
    shutil.copytree(lenet_run, stopped)
    (stopped / "summary.json").unlink()
    capsmed.load_run(lenet_run)
    assert "has not finished" not in caplog.text  # a finished run: summary.json there
    run = capsmed.load_run(stopped)
    said = " ".join(caplog.text.split())
    assert f"{stopped}: its training has not finished (no summary.json, and its resumable " \
           "state was removed), so this loads the epoch 1 checkpoint; it cannot be " \
           "resumed: train it again, then load it again" in said
    caplog.clear()
    capsmed.predict_array(stopped, np.full((40, 40), 200, np.uint8))
    assert "so this predicts with the epoch 1 checkpoint" in " ".join(caplog.text.split())
    assert run.unfinished is not None and not run.unfinished.resumable


def test_preprocess_refuses_fractions_that_split_files_or_folds_replace(tmp_path):
    """``--train/--val/--test`` with ``--split-file`` or ``--folds``, and a split file
    of an unknown split, are refused by the command line; ``capsmed.preprocess``
    ignored the fractions (and recorded them) and wrote a split named 'training'."""
    from capsmed.data.sources.folder.synth import write_class_folders

    write_class_folders(tmp_path / "images", classes=2, images_per_class=4, patients=2,
                        size=16, seed=0)
    (tmp_path / "train.txt").write_text("P01\n")
    (tmp_path / "test.txt").write_text("P02\n")
    files = {"train": str(tmp_path / "train.txt"), "test": str(tmp_path / "test.txt")}
    fractions = {"train": 0.5, "val": 0.0, "test": 0.5}
    for given, name in (({"split_files": files}, "split_files"), ({"folds": 2}, "folds")):
        with pytest.raises(CapsmedError, match=f"^{name} replaces the split fractions; "
                           f"drop fractions, or {name}$"):
            capsmed.preprocess("folder", tmp_path / "images", tmp_path / "s.h5",
                               group_pattern=r"^(P\d+)_", fractions=fractions, **given)
        assert not (tmp_path / "s.h5").exists()
    with pytest.raises(CapsmedError, match=r"^split_files: unknown split\(s\) training "
                       r"\(use train, val, test\)$"):  # was written as a split 'training'
        capsmed.preprocess("folder", tmp_path / "images", tmp_path / "s.h5",
                           group_pattern=r"^(P\d+)_",
                           split_files={"training": files["train"], "test": files["test"]})
    out = capsmed.preprocess("folder", tmp_path / "images", tmp_path / "s.h5", workers=1,
                             group_pattern=r"^(P\d+)_", split_files=files)
    assert read_info(out).split_sizes == {"train": 4, "test": 4}


def test_a_batch_size_below_one_is_refused_not_an_empty_result(lenet_run):
    """``run.predict(images, batch_size=-1)`` stepped past every image: a capsule
    network returned scores [0, 0] for N images, without an error."""
    run = capsmed.load_run(lenet_run)
    images = np.zeros((3, *run.input_shape), np.uint8)
    for size in (0, -1):
        with pytest.raises(CapsmedError, match=f"^batch_size must be >= 1, got {size}$"):
            run.predict(images, batch_size=size)
        with pytest.raises(CapsmedError, match=f"^batch_size must be >= 1, got {size}$"):
            capsmed.predict_array(run, np.full((40, 40), 9, np.uint8), batch_size=size)
    assert run.predict(images, batch_size=2).shape == (3, 3)


def test_predict_inputs_takes_one_path_as_one_input(tmp_path_factory, tmp_path):
    """A single path given as a string was iterated character by character."""
    from tests.helpers import folder_lenet

    run_dir, files = folder_lenet(tmp_path_factory.mktemp("api-one-input"))
    one = capsmed.predict_inputs(run_dir, str(files[0]), tmp_path / "one")
    listed = capsmed.predict_inputs(run_dir, [files[0]], tmp_path / "listed")
    assert (tmp_path / "one" / "predictions.csv").read_text() == \
        (tmp_path / "listed" / "predictions.csv").read_text()
    assert len(one.results) == len(listed.results) == 1 and not one.failed


def test_no_images_give_no_rows_of_the_runs_classes(lenet_run):
    run = capsmed.load_run(lenet_run)
    shape = run.input_shape
    scores = run.predict(np.zeros((0, *shape), np.uint8))
    assert scores.shape == (0, len(run.class_names))


def test_predicting_with_a_run_of_an_older_data_revision_says_so(lenet_run, caplog,
                                                                   monkeypatch):
    """A run trained on images of an older data revision (revision 6 left stain-
    normalised glass as glass) was replayed with today's preprocessing unsaid."""
    import capsmed.data.schema as schema

    image = np.full((40, 40), 200, np.uint8)
    capsmed.predict_array(lenet_run, image)
    assert "data revision" not in caplog.text
    monkeypatch.setattr(schema, "DATA_REVISION", schema.DATA_REVISION + 1)
    capsmed.predict_array(lenet_run, image)
    assert f"trained on images of capsmed's data revision {schema.DATA_REVISION - 1}" in \
        " ".join(caplog.text.split())
    caplog.clear()
    capsmed.predict_array(lenet_run, image)  # said once: a loop over images is not flooded
    assert "data revision" not in caplog.text
