"""Training options are checked at start, before the run folder is written: the
types of a --config YAML, finite numbers in range, model options that build a model
that runs. A refused run leaves nothing, so the same command can run again."""

from __future__ import annotations

import pytest

from tests.faults.common import assert_refused, invoke, lenet_args

# id: (extra flags, YAML --config text or None, text of the error line)
OPTIONS = {
    "lr-inf": (["--lr", "inf"], None, "lr must be a finite number"),
    "lr-nan": (["--lr", "nan"], None, "lr must be a finite number"),
    "lr-zero": (["--lr", "0"], None, "lr must be > 0"),
    "recon-weight-inf": (["--recon-weight", "inf"], None, "recon_weight must be a finite"),
    "fraction-nan": (["--fraction", "nan"], None, "fraction must be a finite number"),
    "negative-width": (["--model-arg", "widths=[-1,5]"], None,
                       "widths=[-1, 5] must be a list of positive integers"),
    "hidden-a-word": (["--model-arg", "hidden=abc"], None, "hidden='abc' must be a list"),
    "kernel-a-word": (["--model-arg", "channels=[4,4]", "--model-arg", "kernel_size=big"],
                      None, "kernel_size='big' must be an integer"),
    "kernel-too-large": (["--model-arg", "channels=[4,4]", "--model-arg", "kernel_size=40"],
                         None, "needs inputs of at least 79x79 pixels"),
    "lr-decay-unused": (["--lr-decay", "0.5"], None,
                        "lr_decay 0.5 has no effect with the constant schedule"),
    "balanced-twice": (["--sampler", "balanced", "--class-weights", "balanced"], None,
                       "sampler balanced and class_weights balanced each correct"),
    "yaml-epochs-a-word": ([], 'epochs: "three"\n', "epochs must be an integer, got 'three'"),
    "yaml-standardize-a-string": ([], 'standardize: "no"\n',
                                  "standardize must be true or false, got 'no'"),
    "yaml-lr-a-string": ([], "lr: 1e-3\n", "lr must be a finite number"),  # YAML 1.1: str
    "yaml-imbalance-a-list": ([], "imbalance: [bright]\n", "imbalance must be a mapping"),
    "yaml-model-kwargs-a-list": ([], "model_kwargs: [1, 2]\n",
                                 "model_kwargs must be a mapping"),
    "yaml-not-a-mapping": ([], "- epochs\n", "expected a mapping of training options"),
}


@pytest.mark.parametrize("case", OPTIONS, ids=list(OPTIONS))
def test_bad_options_are_refused_at_start_and_leave_nothing(toy_h5, tmp_path, case):
    flags, yaml_text, text = OPTIONS[case]
    run = tmp_path / "run"
    extra = list(flags)
    arch = "convnet-avg" if "channels=[4,4]" in flags else "lenet"
    names = "capsmed train" if yaml_text is None else tmp_path / "opts.yaml"
    if yaml_text is not None:
        (tmp_path / "opts.yaml").write_text(yaml_text)
        extra += ["--config", tmp_path / "opts.yaml"]
    if "--model-arg" in flags:
        names = arch
    result = invoke(lenet_args(toy_h5, run, *extra, arch=arch))
    assert_refused(result, names, text=text, absent=[run])
    ok = invoke(lenet_args(toy_h5, run))  # the same folder takes a good run at once
    assert ok.exit_code == 0, ok.output


def test_a_model_that_builds_but_cannot_run_is_refused_before_the_folder(toy_h5, tmp_path,
                                                                          monkeypatch):
    import torch

    import capsmed.train.model_options as model_options

    class Broken(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (1x48 and 12x8)\n"
                               "more torch text")

    monkeypatch.setattr(model_options, "create_model", lambda arch, **kw: Broken())
    run = tmp_path / "run"
    assert_refused(invoke(lenet_args(toy_h5, run)), "lenet", absent=[run],
                   text="cannot classify 1x28x28 images: mat1 and mat2 shapes cannot be "
                        "multiplied (1x48 and 12x8)")


def test_the_check_forward_leaves_the_seeded_run_unchanged(toy_h5, tmp_path):
    """The one-sample forward runs with the global RNG forked: same weights as before."""
    import torch

    from capsmed.device import seed_everything
    from capsmed.models import create_model
    from capsmed.train.model_options import build_model

    kwargs = {"in_channels": 1, "num_classes": 2, "input_size": [28, 28], "widths": [3, 4],
              "hidden": [8]}
    seed_everything(3)
    checked = build_model("lenet", kwargs, (1, 28, 28))
    after_checked = torch.rand(3)
    seed_everything(3)
    plain = create_model("lenet", **kwargs)
    assert torch.equal(torch.rand(3), after_checked)
    assert all(torch.equal(a, b) for a, b in zip(checked.state_dict().values(),
                                                 plain.state_dict().values(), strict=True))
    assert checked.training


@pytest.mark.parametrize(("arch", "kwargs", "text"), [
    ("capsnet", {"kernel_size": 5, "conv_kernel": 3},
     "capsnet: kernel_size sets conv_kernel and primary_kernel; give either kernel_size "
     "or conv_kernel"),
    ("capsnet", {"routing": "em", "routing_eta": 0.2, "grad_through_routing": False},
     "capsnet: routing_eta, grad_through_routing have no effect with routing=em"),
    ("capsnet", {"routing": "none", "routing_iters": 5},
     "capsnet: routing_iters has no effect with routing=none"),
    ("capsnet", {"routing": "none", "grad_through_routing": False},  # one uniform pass
     "capsnet: grad_through_routing has no effect with routing=none"),
    ("em-capsnet", {"mid_types": 8}, "em-capsnet: mid_types has no effect with "
     "capsule_layers=2"),
    ("parallel-dr", {"mid_caps": 4}, "parallel-dr: mid_caps has no effect with "
     "capsule_layers=3"),
])
def test_a_model_option_the_others_make_inert_is_refused(arch, kwargs, text):
    """config.yaml recorded conv_kernel: 3 for a model built with kernel 5, and an eta
    EM routing never uses: a sweep's settings read as something they were not."""
    from capsmed.errors import CapsmedError
    from capsmed.train.model_options import check_inert_options

    with pytest.raises(CapsmedError, match=text.replace("(", r"\(")):
        check_inert_options(arch, kwargs)
    check_inert_options(arch, {k: v for k, v in kwargs.items()
                               if k in ("routing", "kernel_size")})  # alone: fine


def test_a_misspelt_model_option_set_to_null_is_refused(toy_h5, tmp_path):
    """null dropped the option before its name was checked: config.yaml recorded it."""
    run = tmp_path / "run"
    null = invoke(lenet_args(toy_h5, run, "--model-arg", "widht=null"))
    assert_refused(null, "lenet", text="has no option(s) widht", absent=[run])


def test_hed_jitter_on_grey_images_is_refused_before_the_folder(toy_h5, tmp_path):
    """It failed at the first step, leaving a run folder whose resume failed again."""
    run = tmp_path / "run"
    result = invoke(lenet_args(toy_h5, run, "--augment-spec", "hed=0.05"))
    assert_refused(result, toy_h5, text="HED colour jitter (hed=...) needs RGB images",
                   absent=[run])
