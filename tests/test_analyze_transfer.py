"""``capsmed analyze transfer``: layer lists per architecture and the AnB / BnB protocol
at tiny size (frozen layers equal their source, the rest retrained, reruns reuse runs)."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import DatasetWriter
from capsmed.errors import CapsmedError
from capsmed.evaluate.analyses.transfer import TransferConfig, transferable_layers
from capsmed.models import create_model
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train
from tests.helpers import TINY_CAPSNET, assert_clean_failure, scored_capsnet, two_label_run

runner = CliRunner()
FAST = ["--epochs", "1", "--batch-size", "8", "--steps-per-epoch", "2"]
TINY_ARGS = [x for k, v in TINY_CAPSNET.items()
             for x in ("--model-arg", f"{k}={json.dumps(v)}")]


def test_layers_follow_the_parameter_order_without_decoder_and_with_norms_merged():
    caps = create_model("capsnet", **TINY_CAPSNET)
    assert transferable_layers(caps) == [("conv.0",), ("primary.conv",), ("classes",)]
    lenet = create_model("lenet", widths=[3, 4], hidden=[8])
    assert transferable_layers(lenet) == [("features.0",), ("features.3",), ("classifier.1",),
                                          ("classifier.3",)]
    resnext = create_model("resnext50", in_channels=1, num_classes=2, input_size=32,
                           layers=(1, 1, 1, 1), planes=(4, 8, 8, 8), cardinality=2,
                           base_width=32, stem_channels=8)
    layers = transferable_layers(resnext)
    assert layers[0] == ("stem.0", "stem.1")  # convolution + its batch norm
    modules = dict(resnext.named_modules())
    assert not any(isinstance(modules[g[0]], torch.nn.BatchNorm2d) for g in layers)
    assert layers[-1] == ("head.2",)
    named = {n for n, _ in resnext.named_parameters()}
    covered = {n for g in layers for p in g for n in named if n.startswith(p + ".")}
    assert covered == named


def test_protocol_options_are_its_own():
    with pytest.raises(CapsmedError, match="sets transfer_from"):
        TransferConfig(a="a.h5", b="b.h5", out="o", arch="capsnet",
                       train_options={"transfer_from": "x"})
    with pytest.raises(CapsmedError, match="give --arch"):
        TransferConfig(a="a.h5", b="b.h5", out="o")


def test_anb_bnb_protocol_freezes_the_transferred_layers(tiny_h5, tmp_path):
    base_a = train(TrainConfig(data=str(tiny_h5), arch="capsnet", epochs=1, batch_size=8,
                               steps_per_epoch=2, seed=5, out=str(tmp_path / "given-A"),
                               model_kwargs=TINY_CAPSNET), disable_progress=True)
    out = tmp_path / "transfer"
    args = ["-q", "analyze", "transfer", "--a", str(tiny_h5), "--b", str(tiny_h5), "--arch",
            "capsnet", "--base-a", str(base_a), "--layers", "conv.0", "--out", str(out),
            *FAST, *TINY_ARGS]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads((out / "analysis" / "transfer" / "transfer.json").read_text())
    assert [(r["scheme"], r["k"]) for r in record["results"]] == [("base B", 0), ("AnB", 1),
                                                                   ("BnB", 1)]
    assert record["layers"] == ["conv.0"] and record["transfer_seed"] == 1
    for r in record["results"]:
        assert 0.0 <= r["accuracy"] <= 1.0
    weights = {name: load_file(str(path / "checkpoint.safetensors")) for name, path in
               (("A", base_a), ("B", out / "base-B"), ("A1B", out / "A1B"),
                ("B1B", out / "B1B"))}
    for run, source in (("A1B", "A"), ("B1B", "B")):
        for name, value in weights[run].items():
            frozen = name.startswith("conv.0.")
            assert torch.equal(value, weights[source][name]) == frozen, (run, name)
    config = json.loads((out / "A1B" / "checkpoint.json").read_text())["model_kwargs"]
    source = json.loads((base_a / "checkpoint.json").read_text())["model_kwargs"]
    assert config["input_mean"] == source["input_mean"]  # the source's standardisation
    csv = (out / "analysis" / "transfer" / "transfer.csv").read_text().splitlines()
    assert csv[0] == "scheme,k,layers,accuracy,run" and len(csv) == 4
    assert (out / "analysis" / "transfer" / "transfer.png").stat().st_size > 0

    stamp = (out / "A1B" / "checkpoint.safetensors").stat().st_mtime_ns
    again = runner.invoke(app, args)  # finished runs are reused, not retrained
    assert again.exit_code == 0, again.output
    assert (out / "A1B" / "checkpoint.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((out / "analysis" / "transfer" / "transfer.json").read_text()) == record

    other = runner.invoke(app, [*args[:-len(FAST) - len(TINY_ARGS)], "--epochs", "2",
                                "--batch-size", "8", "--steps-per-epoch", "2", *TINY_ARGS])
    assert other.exit_code == 1 and "holds a run with other options" in other.stderr


def test_transfer_refuses_inputs_of_another_shape_before_training(tiny_h5, tmp_path):
    b = tmp_path / "b40.h5"
    with DatasetWriter(b, dataset="toy", kind="folder", domain="generic",
                       class_names=["x", "y"], image_shape=(1, 40, 40),
                       preprocessing={}, source={}) as w:
        w.append("test", np.zeros((2, 1, 40, 40), np.uint8), np.array([0, 1]),
                 np.array(["g0", "g1"]))
    out = tmp_path / "t"
    result = runner.invoke(app, ["-q", "analyze", "transfer", "--a", str(tiny_h5), "--b",
                                 str(b), "--arch", "capsnet", "--out", str(out)])
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "b40.h5: images are 1x40x40" in lines[0]
    assert not out.exists()
    bad = runner.invoke(app, ["-q", "analyze", "transfer", "--a", str(tiny_h5), "--b",
                              str(tiny_h5), "--arch", "capsnet", "--layers", "conv.0,nope",
                              "--out", str(out), *TINY_ARGS])
    assert bad.exit_code == 1 and "layer 'nope' matches no parameter" in bad.stderr
    assert not (out / "A1B").exists()


def test_a_class_layer_between_other_classes_is_refused_before_training(tiny_h5, tmp_path):
    """--layers naming the class layer, A's classes not B's (here the same in another
    order): AnB scored B's classes with A's class rows; refused before any run trains."""
    b = tmp_path / "swapped.h5"
    shutil.copy(tiny_h5, b)
    with h5py.File(b, "r+") as f:
        names = json.loads(f.attrs["class_names"])[::-1]
        f.attrs["class_names"] = json.dumps(names)
        for split in f.values():
            split["labels"].attrs["class_names"] = json.dumps(names)
    out = tmp_path / "t"
    result = runner.invoke(app, ["-q", "analyze", "transfer", "--a", str(tiny_h5), "--b",
                                 str(b), "--arch", "capsnet", "--layers", "conv.0,classes",
                                 "--out", str(out), *FAST, *TINY_ARGS])
    assert result.exit_code == 1
    assert ("layer 'classes' holds its class layer 'classes'" in result.stderr
            and "(the same classes in another order)" in result.stderr
            and "leave it out of --layers" in result.stderr), result.output
    assert not out.exists()


def test_a_base_run_must_be_trained_on_its_task(tiny_h5, tmp_path):
    """--base-b is "base B": a network trained on --b; one trained on other data would
    fill the table with another task's numbers."""
    other = tmp_path / "other.h5"
    shutil.copy(tiny_h5, other)
    with h5py.File(other, "a") as f:  # same classes and shapes, other content
        f.attrs["created"] = "elsewhere"
    base = train(TrainConfig(data=str(tiny_h5), arch="capsnet", epochs=1, batch_size=8,
                             steps_per_epoch=1, out=str(tmp_path / "on-a"),
                             model_kwargs=TINY_CAPSNET), disable_progress=True)
    out = tmp_path / "t"
    result = runner.invoke(app, ["-q", "analyze", "transfer", "--a", str(tiny_h5), "--b",
                                 str(other), "--base-b", str(base), "--layers", "conv.0",
                                 "--out", str(out), *FAST, *TINY_ARGS])
    assert result.exit_code == 1 and "was not trained on --b" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("arch", ["parallel-dr", "resnext50", "em-capsnet"])
def test_networks_with_branches_or_shortcuts_need_named_layers(tiny_h5, tmp_path, arch):
    result = runner.invoke(app, ["-q", "analyze", "transfer", "--a", str(tiny_h5), "--b",
                                 str(tiny_h5), "--arch", arch, "--out", str(tmp_path / "t")])
    assert result.exit_code == 1 and "name the layers with --layers" in result.stderr


@pytest.mark.parametrize("layers", ["conv.0,conv.0", "conv.0,conv.0.weight"])
def test_a_layer_given_twice_is_refused(tiny_h5, tmp_path, layers):
    """A repeated (or covered) prefix made A2B transfer what A1B did, silently."""
    result = runner.invoke(app, ["-q", "analyze", "transfer", "--a", str(tiny_h5), "--b",
                                 str(tiny_h5), "--arch", "capsnet", "--layers", layers,
                                 "--out", str(tmp_path / "t")])
    assert result.exit_code == 1 and "is given twice" in result.stderr, result.output
    assert not (tmp_path / "t").exists()


def test_transfer_copies_batch_norm_statistics_with_the_weights(tmp_path):
    from capsmed.models import create_model
    from capsmed.train.checkpoint import save_checkpoint
    from capsmed.train.run import transfer_parameters

    kwargs = {"in_channels": 1, "num_classes": 2, "input_size": [28, 28]}
    source = create_model("em-capsnet", **kwargs)  # a ResNeXt stem: batch norms
    norms = [(n, m) for n, m in source.named_modules() if isinstance(m, nn.BatchNorm2d)]
    name, norm = norms[0]
    norm.running_mean.fill_(0.25)
    norm.running_var.fill_(4.0)
    save_checkpoint(tmp_path, source, {"arch": "em-capsnet", "model_kwargs": kwargs,
                                       "epoch": 1, "data": "x.h5", "class_names": ["a", "b"]})
    (tmp_path / "summary.json").write_text("{}")  # a finished source run
    target = create_model("em-capsnet", **kwargs)
    transfer_parameters(target, tmp_path, [name], freeze=True, arch="em-capsnet")
    copied = dict(target.named_modules())[name]
    assert torch.equal(copied.running_mean, norm.running_mean)
    assert torch.equal(copied.running_var, norm.running_var)
    # frozen: the statistics stay as transferred through model.train() and a training
    # step (in training mode a batch norm normalises by the batch and updates them)
    target.train()
    target(torch.randn(4, 1, 28, 28))
    assert not copied.training
    assert torch.equal(copied.running_mean, norm.running_mean)
    assert torch.equal(copied.running_var, norm.running_var)
    features = torch.randn(4, copied.num_features, 5, 5)
    torch.testing.assert_close(copied(features), torch.nn.functional.batch_norm(
        features, norm.running_mean, norm.running_var, copied.weight, copied.bias,
        training=False, eps=copied.eps))
    thawed = create_model("em-capsnet", **kwargs)  # not frozen: trains as usual
    transfer_parameters(thawed, tmp_path, [name], freeze=False, arch="em-capsnet")
    thawed.train()
    thawed(torch.randn(4, 1, 28, 28))
    assert not torch.equal(dict(thawed.named_modules())[name].running_mean,
                           norm.running_mean)


def test_unfinished_or_changed_sources_are_refused(tiny_h5, tmp_path):
    """A base run still training lent the layers of an intermediate epoch, and after it
    changed a rerun reused AnB runs holding the old layers."""
    from capsmed.train.loop import TrainingInterrupted

    def base(name, seed, epochs=1, **stop):
        cfg = TrainConfig(data=str(tiny_h5), arch="capsnet", epochs=epochs, batch_size=8,
                          steps_per_epoch=1, patience=None, seed=seed,
                          out=str(tmp_path / name),
                          model_kwargs=TINY_CAPSNET)
        try:
            return train(cfg, disable_progress=True, **stop)
        except TrainingInterrupted:
            return tmp_path / name

    given = base("given", 5, epochs=3, stop_after_steps=2)  # epoch 1 of 3 kept, resumable
    out = tmp_path / "transfer"
    args = ["-q", "analyze", "transfer", "--a", str(tiny_h5), "--b", str(tiny_h5),
            "--base-a", str(given), "--base-b", str(given), "--layers", "conv.0", "--out",
            str(out), *FAST, *TINY_ARGS]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "its training has not finished" in result.stderr
    assert not out.exists()

    shutil.rmtree(given)
    shutil.copytree(base("first", 5), given)
    assert runner.invoke(app, args).exit_code == 0
    shutil.rmtree(given)  # the source is trained again: other weights
    shutil.copytree(base("second", 6), given)
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "A1B: its frozen layers" in result.stderr


def test_model_args_the_given_base_runs_lack_are_refused(tiny_h5, tmp_path):
    """With both base runs given, every transfer run takes their model options: a
    --model-arg applied to no run, and transfer.json recorded it as if it had."""
    bases = [train(TrainConfig(data=str(tiny_h5), arch="capsnet", epochs=1, batch_size=8,
                               steps_per_epoch=1, out=str(tmp_path / name),
                               model_kwargs=TINY_CAPSNET), disable_progress=True)
             for name in ("base-a", "base-b")]
    out = tmp_path / "t"
    args = ["-q", "analyze", "transfer", "--a", str(tiny_h5), "--b", str(tiny_h5),
            "--base-a", str(bases[0]), "--base-b", str(bases[1]), "--out", str(out), *FAST]
    result = runner.invoke(app, [*args, "--layers", "conv.0", "--model-arg", "routing_iters=1"])
    assert_clean_failure(result, "--model-arg routing_iters=1: --base-a", out)
    # the options the bases were trained with (and defaults) are no contradiction
    checked = runner.invoke(app, [*args, "--layers", "nope", *TINY_ARGS,
                                  "--model-arg", "routing_iters=3"])
    assert checked.exit_code == 1 and "layer 'nope' matches no parameter" in checked.stderr


def test_a_run_killed_while_it_finished_is_resumed_not_reused(tiny_h5, tmp_path,
                                                              monkeypatch):
    """resume.pt beside summary.json is a run killed between the two (one rule for a
    finished run): it was reused as finished, its resume.pt left, so the transfer runs
    after it refused it as unfinished."""
    from capsmed.evaluate.analyses.transfer import train_or_reuse
    from capsmed.train.handlers.resumable_state import ResumableState
    from capsmed.train.run_config import training_unfinished

    cfg = TrainConfig(data=str(tiny_h5), arch="capsnet", epochs=1, batch_size=8,
                      steps_per_epoch=1, out=str(tmp_path / "base-A"),
                      model_kwargs=TINY_CAPSNET)
    with monkeypatch.context() as m:  # killed before removing its resume.pt
        m.setattr(ResumableState, "on_end", lambda self, loop: None)
        run = train_or_reuse(cfg, True)
    assert (run / "summary.json").is_file() and (run / "resume.pt").is_file()
    assert train_or_reuse(cfg, True) == run
    assert training_unfinished(run) is None and not (run / "resume.pt").exists()


def test_a_two_label_test_split_with_a_class_given_twice_is_refused(tmp_path):
    """Two-digit accuracy counts an image right when both its labels are in the top two:
    with one class given twice that was its first label alone (the base B network scored
    1.0 where the other image's digits were not both found), as evaluate refuses."""
    from capsmed.evaluate.analyses.transfer import _accuracy

    model, kwargs, images, order = scored_capsnet(4)
    second = order[:, 1].copy()
    second[0] = order[0, 0]
    data, run = two_label_run(tmp_path, model, kwargs, images, order[:, 0], second)
    with pytest.raises(CapsmedError, match="1 image.s. whose two labels .labels, "
                                           "meta.label2. are the same class"):
        _accuracy(run, data, 8, "cpu")
    out = tmp_path / "t"
    result = runner.invoke(app, ["-q", "analyze", "transfer", "--a", str(data), "--b",
                                 str(data), "--arch", "capsnet", "--out", str(out)])
    assert_clean_failure(result, "two.h5: split 'test' has 1 image(s) whose two labels",
                         out)
