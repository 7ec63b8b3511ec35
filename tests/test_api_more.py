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
