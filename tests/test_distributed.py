"""torchrun + gloo on 2 CPU processes: a run on several ranks computes what one
process computes (test_training_engine.py has the plain comparison, augmentation on)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import h5py
import pytest
import torch
from safetensors.torch import load_file

from capsmed.runs.checkpoint import load_checkpoint
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train
from capsmed.train.losses import training_loss
from capsmed.train.state import load_state
from tests.helpers import TINY

pytestmark = pytest.mark.slow

TINY_LENET = {"widths": [3, 4], "hidden": [8]}

# trains (or resumes) under torchrun; CHECK_EVERY small so that a stop falls mid-epoch
SCRIPT = textwrap.dedent("""
    import json, sys
    from capsmed.train import loop
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import resume, train
    loop.CHECK_EVERY = 2
    options, stop = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    try:
        if options.get("resume"):
            resume(options["resume"], disable_progress=True)
        else:
            train(TrainConfig(**options), disable_progress=True, stop_after_steps=stop)
    except loop.TrainingInterrupted:
        pass
""")


def _torchrun(tmp_path, options, stop=None):
    script = tmp_path / "ddp_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(script), json.dumps(options), json.dumps(stop)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300,
                          cwd=os.getcwd())
    assert done.returncode == 0, done.stderr[-3000:]


def _metrics(run):
    return [{k: v for k, v in json.loads(x).items() if k not in ("seconds", "images_per_s")}
            for x in (run / "metrics.jsonl").read_text().splitlines()]


def _options(tiny_h5, out, **extra):
    return {"data": str(tiny_h5), "arch": "lenet", "epochs": 2, "seed": 4, "device": "cpu",
            "model_kwargs": TINY_LENET, "lr": 0.01, "out": str(out), **extra}


def test_ddp_weighs_uneven_and_empty_shares_as_one_process(tiny_h5, tmp_path):
    """34 training samples in batches of 11: shares of 6 and 5 samples, and a last batch
    of 1 that leaves rank 1 nothing. The gradient is the global batch's mean (an even
    average of the ranks' means weighed the smaller share more; an empty share's mean
    was NaN and stopped the run)."""
    options = _options(tiny_h5, tmp_path / "ddp", batch_size=11)
    _torchrun(tmp_path, options)
    one = train(TrainConfig(**{**options, "out": str(tmp_path / "one")}),
                disable_progress=True)
    ddp = tmp_path / "ddp"
    for x, y in zip(_metrics(ddp), _metrics(one), strict=True):
        assert x["train_loss"] == pytest.approx(y["train_loss"], rel=1e-6)
        assert x["val_loss"] == pytest.approx(y["val_loss"], rel=1e-6)
    wa = load_file(str(ddp / "checkpoint.safetensors"))
    wb = load_file(str(one / "checkpoint.safetensors"))
    assert all(torch.allclose(wa[k], wb[k], rtol=0, atol=1e-6) for k in wa)


def test_ddp_resumed_mid_epoch_keeps_every_ranks_sums(tiny_h5, tmp_path):
    """Stopped at step 2 of 5 and resumed: the epoch's train loss and accuracy count
    both ranks' first steps once (the state held rank 0's sums, which every rank then
    started from: rank 0's half counted twice, rank 1's lost)."""
    run = tmp_path / "ddp"
    options = _options(tiny_h5, run, batch_size=8)
    _torchrun(tmp_path, options, stop=2)
    state = load_state(run)
    assert state["progress"]["epoch"] == 1 and state["progress"]["step"] == 2
    _torchrun(tmp_path, {"resume": str(run)})
    one = train(TrainConfig(**{**options, "out": str(tmp_path / "one")}),
                disable_progress=True)
    for x, y in zip(_metrics(run), _metrics(one), strict=True):
        assert x["train_acc"] == pytest.approx(y["train_acc"], rel=1e-6)
        assert x["train_loss"] == pytest.approx(y["train_loss"], rel=1e-6)


def test_ddp_validates_the_batchnorm_statistics_of_the_checkpoint(tiny_h5, tmp_path):
    """Each rank's BatchNorm statistics after the last step are its own share's; the
    validation loss recorded (metrics.jsonl, checkpoint.json) is that of the weights
    rank 0 writes."""
    run = tmp_path / "ddp"
    _torchrun(tmp_path, {**_options(tiny_h5, run, batch_size=12, epochs=1),
                         "arch": "resnext50", "model_kwargs": TINY["resnext50"]})
    model, meta = load_checkpoint(run)
    model.eval()
    with h5py.File(tiny_h5) as f:
        x = torch.from_numpy(f["val/images"][:]).float() / 255
        y = torch.from_numpy(f["val/labels"][:])
    with torch.no_grad():
        loss = training_loss(model.loss_kind, model(x), x, y, 0.0).item()
    assert meta["val_loss"] == pytest.approx(loss, rel=1e-6)
    assert _metrics(run)[0]["val_loss"] == meta["val_loss"]


def test_ddp_augments_around_an_empty_share(tiny_h5, tmp_path):
    """34 training samples in batches of 11 with --augment: the last batch of 1 leaves
    rank 1 nothing; it still draws the batch's transforms (the generator stays in step)
    and trains as one process does (applying them to no image raised at the end of the
    first epoch)."""
    options = _options(tiny_h5, tmp_path / "ddp", batch_size=11, augment=True)
    _torchrun(tmp_path, options)
    one = train(TrainConfig(**{**options, "out": str(tmp_path / "one")}),
                disable_progress=True)
    for x, y in zip(_metrics(tmp_path / "ddp"), _metrics(one), strict=True):
        assert x["train_loss"] == pytest.approx(y["train_loss"], rel=1e-6)
