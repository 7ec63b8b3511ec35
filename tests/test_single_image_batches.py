"""A batch of one image under batch norm: refused before anything is written (it
stopped with a traceback after the first epoch, its folder written, and --resume met
the same batch)."""

from __future__ import annotations

import h5py
import pytest
import torch
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.train import distributed
from capsmed.train.run_checks import check_single_image_batches
from capsmed.train.sampling import BatchSampler
from tests.helpers import TINY, assert_clean_failure

runner = CliRunner()


@pytest.fixture(scope="module")
def digits_h5(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits") / "digits.h5"
    result = runner.invoke(app, ["preprocess", "digits", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _model_args(arch):
    return [a for k, v in TINY[arch].items()
            for a in ("--model-arg", f"{k}={list(v) if isinstance(v, tuple) else v}")]


def test_a_last_batch_of_one_image_under_batch_norm_is_refused(tmp_path, digits_h5):
    with h5py.File(digits_h5) as f:
        n = len(f["train/labels"])
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "--data", str(digits_h5), "--arch", "resnext50",
                                 *_model_args("resnext50"), "--epochs", "1",
                                 "--batch-size", str(n - 1), "-o", str(out)])
    assert_clean_failure(result, "cannot train on one image at input size 28x28", out)
    assert "--batch-size" in result.stderr


def test_a_model_whose_batch_norm_takes_one_image_is_probed_and_left_as_it_was():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2),
                                torch.nn.Dropout(0.5))
    model.eval()
    buffers = [b.clone() for b in model.buffers()]
    rng = torch.get_rng_state()
    check_single_image_batches(model, {1, 8}, distributed.Distributed(),
                               (1, 5, 5), torch.device("cpu"))  # a 3x3 map: fine
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers(), strict=True))
    assert torch.equal(rng, torch.get_rng_state()) and not model.training
    flat = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 5), torch.nn.BatchNorm2d(2))
    with pytest.raises(Exception, match="cannot train on one image at input size 5x5"):
        check_single_image_batches(flat, {8, 1}, distributed.Distributed(), (1, 5, 5),
                                   torch.device("cpu"))


@pytest.mark.parametrize(("n", "mode", "steps", "sizes"), [
    (10, "shuffle", None, {3, 1}), (9, "shuffle", None, {3}), (2, "shuffle", None, {2}),
    (10, "shuffle", 7, {3}), (10, "balanced", None, {2})])
def test_the_sampler_names_the_sizes_of_its_batches(n, mode, steps, sizes):
    labels = torch.arange(n) % 2
    sampler = BatchSampler(labels, 3, mode, steps, torch.Generator().manual_seed(0))
    assert sampler.batch_sizes() == sizes
    assert {len(batch) for batch in sampler} == sizes
