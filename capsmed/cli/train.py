"""``capsmed train``: one training run -> a self-describing run directory."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import handles_errors, only_set, parse_key_values


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
    augment_recipe: str = typer.Option(None, help="paper000-medical, paper000-mnist, "
                                       "paper000-fashion or paper001 (implies --augment)."),
    model_arg: list[str] = typer.Option(None, help="Architecture option key=value, "
                                        "repeatable (e.g. conv_channels=64)."),
    config: Path = typer.Option(None, help="YAML file of these options; flags override it."),
) -> None:
    """Train a model; keeps the checkpoint at minimum validation loss."""
    from capsmed.data.protocols import parse_imbalance
    from capsmed.train.config import TrainConfig, read_options_yaml
    from capsmed.train.engine import train as run_training

    base = read_options_yaml(config) if config else {}
    overrides = only_set(data=str(data) if data else None, arch=arch, epochs=epochs,
                         batch_size=batch_size, lr=lr, recon_weight=recon_weight, seed=seed,
                         device=device, out=str(out) if out else None, fraction=fraction,
                         imbalance=parse_imbalance(imbalance) if imbalance else None,
                         steps_per_epoch=steps_per_epoch, sampler=sampler,
                         patience=patience, optimizer=optimizer, lr_schedule=lr_schedule,
                         class_weights=class_weights,
                         augment=True if augment_recipe else augment,
                         augment_recipe=augment_recipe)
    merged = {**base, **overrides}
    merged["model_kwargs"] = {**base.get("model_kwargs", {}),
                              **parse_key_values(model_arg, "--model-arg"),
                              **only_set(branches=branches)}
    run_dir = run_training(TrainConfig.from_dict(merged, origin="capsmed train"))
    typer.echo(f"run saved to {run_dir}; evaluate it with: capsmed evaluate {run_dir}")
