"""A run folder or its dataset that changed since training is refused by --resume and
evaluate with one line naming the file: a dataset edited in place, a malformed
config.yaml, a resume.pt that is empty, pickled or foreign, tampered test rows, a
checkpoint.json that is not an object."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import yaml

from tests.faults.common import assert_refused, invoke, lenet_args


def _flip_labels(path):
    with h5py.File(path, "r+") as f:
        labels = f["train/labels"][...]
        f["train/labels"][...] = 1 - labels  # same classes, same shapes: only content


def _interrupted_run(data, run):
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train
    from capsmed.train.loop import TrainingInterrupted
    from tests.faults.common import TINY_LENET

    with pytest.raises(TrainingInterrupted):
        train(TrainConfig(data=str(data), arch="lenet", epochs=2, batch_size=16,
                          out=str(run), model_kwargs=TINY_LENET), disable_progress=True,
              stop_after_steps=2)
    return run


def test_resume_refuses_a_dataset_edited_in_place(toy_copy, tmp_path):
    run = _interrupted_run(toy_copy, tmp_path / "run")
    digest = yaml.safe_load((run / "config.yaml").read_text())["dataset"]["digest"]
    assert digest.startswith("sha256:")
    _flip_labels(toy_copy)  # h5py keeps the 'created' attribute: only the digest tells
    state = (run / "resume.pt").read_bytes()
    assert_refused(invoke(["train", "--resume", run]), toy_copy,
                   text=f"changed since {run} was trained", unchanged={run / "resume.pt": state})


def test_evaluate_refuses_the_runs_own_data_edited_in_place(toy_copy, tmp_path):
    run = tmp_path / "run"
    assert invoke(lenet_args(toy_copy, run)).exit_code == 0
    _flip_labels(toy_copy)
    assert_refused(invoke(["evaluate", run]), toy_copy, text="changed since",
                   absent=[run / "report"])
    other = invoke(["evaluate", run, "--data", toy_copy, "--report-name", "edited"])
    assert other.exit_code == 0, other.output  # named explicitly: another file


@pytest.fixture(scope="module")
def interrupted_run(toy_h5, tmp_path_factory):
    return _interrupted_run(toy_h5, tmp_path_factory.mktemp("interrupted") / "run")


def _edit_config(change):
    def edit(run):
        path = run / "config.yaml"
        path.write_text(change(path.read_text()))
        return path
    return edit


def _edit_state(change):
    def edit(run):
        import torch

        path = run / "resume.pt"
        state = torch.load(path, weights_only=True)
        torch.save(change(state), path)
        return path
    return edit


def _pickled_state(run):
    import fractions

    import torch

    path = run / "resume.pt"
    torch.save({"version": 1, "model": fractions.Fraction(1, 3)}, path)  # a Python object
    return path


def _truncated_state(run):
    path = run / "resume.pt"
    path.write_bytes(path.read_bytes()[:500])
    return path


def _wrong_shapes(state):
    state["model"] = {k: v[..., :1] if v.ndim else v for k, v in state["model"].items()}
    return state


RESUME_FAULTS = {  # id: (edit returning the file to name, text of the error line)
    "config-not-yaml": (_edit_config(lambda t: "train: [unclosed\n"),
                        "cannot read the run's options"),
    "config-a-list": (_edit_config(lambda t: "- train\n- dataset\n"),
                      "section(s) train, model_kwargs, dataset missing"),
    "config-epochs-a-word": (_edit_config(lambda t: t.replace("epochs: 2", "epochs: three")),
                             "epochs must be an integer, got 'three'"),
    "state-empty-model": (_edit_state(lambda s: {**s, "model": {}}), "model (empty)"),
    "state-no-progress": (_edit_state(lambda s: {k: v for k, v in s.items()
                                                 if k != "progress"}), "progress"),
    "state-other-shapes": (_edit_state(_wrong_shapes), "does not fit this run's model"),
    "state-pickled": (_pickled_state, "holds pickled Python objects, which capsmed does not"),
    "state-truncated": (_truncated_state, "cannot read resumable state"),
}


@pytest.mark.parametrize("fault", RESUME_FAULTS, ids=list(RESUME_FAULTS))
def test_resume_refuses_a_damaged_run_in_one_line(interrupted_run, tmp_path, fault):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(interrupted_run, run)
    edit, text = RESUME_FAULTS[fault]
    named = edit(run)
    before = {p: p.read_bytes() for p in run.iterdir()}
    line = assert_refused(invoke(["train", "--resume", run]), named, text=text,
                          unchanged=before)
    assert "weights_only" not in line  # torch's advice to unpickle is not repeated


@pytest.fixture(scope="module")
def fold_run(tmp_path_factory):
    """A cross-validation run (its test rows are saved in test_indices.npy)."""
    from capsmed.data.contract import DatasetWriter
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train
    from tests.faults.common import TINY_LENET

    root = tmp_path_factory.mktemp("cv")
    labels = np.arange(60) % 2
    images = (np.random.default_rng(0).random((60, 1, 28, 28)) * 60
              + labels[:, None, None, None] * 150).astype(np.uint8)
    groups = [f"p{i // 2}" for i in range(60)]
    with DatasetWriter(root / "cv.h5", dataset="toy-cv", kind="folder", domain="generic",
                       class_names=["dark", "bright"],
                       image_shape=(1, 28, 28), preprocessing={}, source={}) as writer:
        writer.append("all", images, labels, groups,
                      folds=np.array([(i // 2) % 3 for i in range(60)]))
    return train(TrainConfig(data=str(root / "cv.h5"), arch="lenet", epochs=1,
                             batch_size=16, fold=0, out=str(root / "run"),
                             model_kwargs=TINY_LENET), disable_progress=True)


def _save_rows(values, **kwargs):
    def edit(run):
        path = run / "test_indices.npy"
        np.save(path, values, **kwargs)
        return path
    return edit


def _truncate_rows(run):
    path = run / "test_indices.npy"
    path.write_bytes(path.read_bytes()[:-7])
    return path


def _meta(value):
    def edit(run):
        path = run / "checkpoint.json"
        path.write_text(value)
        return path
    return edit


def _meta_field(**changes):
    def edit(run):
        import json

        path = run / "checkpoint.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
        return path
    return edit


def _other_weights(run):
    """Weights of the same shapes from another training (as a copied-in file)."""
    from safetensors.torch import load_file, save_file

    path = run / "checkpoint.safetensors"
    save_file({k: v + 0.01 if v.is_floating_point() else v
               for k, v in load_file(str(path)).items()}, str(path))
    return path


EVALUATE_FAULTS = {  # id: (edit returning the file to name, text of the error line)
    "weights-from-another-checkpoint": (_other_weights, "not the weights checkpoint.json"),
    "checkpoint-of-another-arch": (_meta_field(arch="convnet-avg"),
                                   "its arch differ from"),
    "checkpoint-of-other-classes": (_meta_field(class_names=["a", "b"]),
                                    "its classes differ from"),
    "rows-object-array": (_save_rows(np.array([1, "x"], dtype=object), allow_pickle=True),
                          "cannot read the saved rows"),
    "rows-truncated": (_truncate_rows, "cannot read the saved rows"),
    "rows-missing": (lambda run: (run / "test_indices.npy").unlink() or
                     run / "test_indices.npy", "missing; this cross-validation run's"),
    "rows-out-of-range": (_save_rows(np.array([0, 1, 60])), "within 0..59"),
    "rows-negative": (_save_rows(np.array([-1, 2])), "within 0..59"),
    "rows-floats": (_save_rows(np.array([0.0, 1.5])), "expected a 1-D array of row numbers"),
    "rows-two-d": (_save_rows(np.zeros((2, 2), np.int64)), "expected a 1-D array"),
    "checkpoint-json-a-list": (_meta("[1, 2]"), "a JSON list, expected an object"),
    "checkpoint-json-no-arch": (_meta('{"model_kwargs": {}}'), "arch, epoch, data"),
    "checkpoint-json-not-json": (_meta("{arch: lenet"), "malformed checkpoint metadata"),
}


@pytest.mark.parametrize("fault", EVALUATE_FAULTS, ids=list(EVALUATE_FAULTS))
def test_evaluate_refuses_a_tampered_run_in_one_line(fold_run, tmp_path, fault):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(fold_run, run)
    edit, text = EVALUATE_FAULTS[fault]
    named = edit(run)
    line = assert_refused(invoke(["evaluate", run]), named, text=text,
                          absent=[run / "report"])
    assert "safetensors" not in line.replace("checkpoint.safetensors", "")  # no internals
