"""``capsmed train``: one training run -> a self-describing run directory."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set, parse_key_values
from capsmed.errors import CapsmedError


@handles_errors
def train(
    data: Path = typer.Option(None, help="Dataset .h5 (from capsmed preprocess)."),
    arch: str = typer.Option(None, help="Architecture (see: capsmed models)."),
    epochs: int = typer.Option(None, help="Training epochs [50]."),
    batch_size: int = typer.Option(None, help="Batch size [128]."),
    lr: float = typer.Option(None, help="Adam learning rate [1e-3; 1e-4 for medical sets]."),
    recon_weight: float = typer.Option(None, help="Reconstruction loss weight [5e-4; 5e-5 "
                                       "for medical sets]."),
    seed: int = typer.Option(None, help="Random seed [0]."),
    device: str = typer.Option(None, help="auto, cpu, cuda, cuda:1, mps [auto]."),
    out: Path = typer.Option(None, help="Run directory [runs/<dataset>-<arch>-s<seed>-<time>]."),
    branches: int = typer.Option(None, help="Parallel branches (parallel-dr; paper 001's "
                                 "best: 12). Same as --model-arg branches=N."),
    fraction: float = typer.Option(None, help="Train on this share of the training split, "
                                   "per class; same iterations as the full split "
                                   "(paper 000)."),
    imbalance: str = typer.Option(None, help="Reduce classes: CLASS=PERCENT[,CLASS=PERCENT] "
                                  "(paper 000: one class to 20)."),
    steps_per_epoch: int = typer.Option(None, help="Batches per epoch [one pass; paper 001: "
                                        "500]."),
    sampler: str = typer.Option(None, help="shuffle or balanced (same count of every class "
                                "per batch, paper 001) [shuffle]."),
    patience: int = typer.Option(None, help="Early stop after this many epochs without a "
                                 "better validation loss [20]."),
    optimizer: str = typer.Option(None, help="adam or nadam [adam]."),
    lr_schedule: str = typer.Option(None, help="constant or exponential [constant]."),
    class_weights: str = typer.Option(None, help="'balanced': weight each sample's loss "
                                      "by N/(K n_c) of its class."),
    augment: bool = typer.Option(None, "--augment/--no-augment", help="Augment batches on "
                                 "the device with the papers' recipe for the dataset."),
    augment_recipe: str = typer.Option(None, "--augment-recipe", "--augment-spec",
                                       help="paper000-medical, paper000-mnist, "
                                       "paper000-fashion, paper001, or a spec such as "
                                       "'rotation=15,translation=0.1,hflip' (implies "
                                       "--augment)."),
    fold: int = typer.Option(None, help="Cross-validation: test on fold K of a file with "
                             "folds (e.g. AML), train on the others (paper 001)."),
    folds: int = typer.Option(None, help="Expected number of folds (checked against the "
                              "file)."),
    per_class_limit: int = typer.Option(None, help="At most X samples per class (paper 001's "
                                        "small-data protocol; with --fold the rest is "
                                        "tested)."),
    precision: str = typer.Option(None, help="auto (bf16/fp16 autocast on GPU, fp32 on CPU), "
                                  "fp32, bf16 or fp16 [auto]. Routing stays fp32."),
    channels_last: bool = typer.Option(None, "--channels-last/--no-channels-last",
                                       help="Channels-last memory format [on CUDA]."),
    compile_model: bool = typer.Option(None, "--compile/--no-compile",
                                       help="torch.compile the model (slow start, faster "
                                       "long runs)."),
    data_loading: str = typer.Option(None, help="memory, stream (read HDF5 per batch) or "
                                     "auto [auto]."),
    loader_workers: int = typer.Option(None, help="Reader processes when streaming [2]."),
    tensorboard: bool = typer.Option(None, "--tensorboard/--no-tensorboard",
                                     help="Also write TensorBoard logs to RUN_DIR/tensorboard."),
    resume: Path = typer.Option(None, help="Continue an interrupted run directory (all other "
                                "options come from its config.yaml)."),
    model_arg: list[str] = typer.Option(None, help="Architecture option key=value, "
                                        "repeatable (e.g. conv_channels=64)."),
    config: Path = typer.Option(None, help="YAML file of these options; flags override it."),
) -> None:
    """Train a model; keeps the checkpoint at minimum validation loss."""
    from capsmed.data.challenges import parse_imbalance
    from capsmed.train.config import TrainConfig, read_options_yaml
    from capsmed.train.engine import resume as resume_training
    from capsmed.train.engine import train as run_training

    base = read_options_yaml(config) if config else {}
    if augment is False:  # --no-augment: the flag overrides a recipe in the YAML
        if augment_recipe:
            raise CapsmedError("--no-augment and --augment-recipe contradict each other; "
                               "drop one")
        base.pop("augment_recipe", None)
    overrides = only_set(data=str(data) if data else None, arch=arch, epochs=epochs,
                         batch_size=batch_size, lr=lr, recon_weight=recon_weight, seed=seed,
                         device=device, out=str(out) if out else None, fraction=fraction,
                         imbalance=parse_imbalance(imbalance) if imbalance else None,
                         steps_per_epoch=steps_per_epoch, sampler=sampler,
                         patience=patience, optimizer=optimizer, lr_schedule=lr_schedule,
                         class_weights=class_weights,
                         augment=True if augment_recipe else augment,
                         augment_recipe=augment_recipe, fold=fold, folds=folds,
                         per_class_limit=per_class_limit, precision=precision,
                         channels_last=channels_last, compile=compile_model,
                         data_loading=data_loading, loader_workers=loader_workers,
                         tensorboard=tensorboard)
    if resume is not None:
        if overrides or base or model_arg or branches is not None:
            raise CapsmedError("--resume continues a run with its own options (its "
                               "config.yaml); give no other training options")
        run_dir = resume_training(resume)
        echo_wrapped(f"run saved to {run_dir}; evaluate it with: capsmed evaluate {run_dir}")
        return
    merged = {**base, **overrides}
    given = parse_key_values(model_arg, "--model-arg")
    if branches is not None and given.get("branches", branches) != branches:
        raise CapsmedError(f"--branches {branches} and --model-arg "
                           f"branches={given['branches']} contradict each other; drop one")
    merged["model_kwargs"] = {**base.get("model_kwargs", {}), **given,
                              **only_set(branches=branches)}
    run_dir = run_training(TrainConfig.from_dict(merged, origin="capsmed train"))
    echo_wrapped(f"run saved to {run_dir}; evaluate it with: capsmed evaluate {run_dir}")
