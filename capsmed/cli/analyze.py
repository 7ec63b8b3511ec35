"""``capsmed analyze ...``: the papers' analyses of trained runs (RUN_DIR/analysis/<name>/)."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set, parse_key_values
from capsmed.cli.options import OUTPUT_FLAGS, device_option, flag, option
from capsmed.evaluate.analyses.configs import AffineConfig, CompactnessConfig, ManifoldConfig
from capsmed.train.config import TrainConfig

app = typer.Typer(help="Analyses of trained runs: affine robustness, MultiMNIST two-digit "
                  "accuracy, routing entropy, semantic compactness, t-SNE manifold, "
                  "layer transfer.",
                  no_args_is_help=True)


def _show(*tables) -> None:
    from capsmed.tables.terminal import print_tables

    print_tables(tables)


def _done(out: Path) -> None:
    from capsmed.evaluate.analyses.common import written

    echo_wrapped(f"written to {out}/ ({', '.join(written(out))})")


@app.command("affine")
@handles_errors
def affine(
    run_dir: Path = typer.Argument(..., help="A run directory written by capsmed train."),
    data: Path = typer.Option(None, help="Take the test images from this .h5 instead (same "
                              "classes and image size)."),
    affnist: Path = typer.Option(None, help="Also score this affNIST file (capsmed "
                                 "preprocess affnist; 1x40x40 digits 0-9)."),
    split: str = option(AffineConfig, "split", "Split to transform"),
    repeats: int = option(AffineConfig, "repeats", "Random transforms per image"),
    sweep_step: float = option(AffineConfig, "sweep_step", "Degrees between rotation-sweep "
                               "angles"),
    keep_inside: bool = flag(AffineConfig, "keep_inside", "Narrow shifts so the content "
                             "stays on the canvas, as affNIST", off="free-translation"),
    padding: str = option(AffineConfig, "padding", "zeros (affNIST), border or reflection"),
    max_samples: int = option(AffineConfig, "max_samples", "Use a seeded random subset of "
                              "this size", meaning="all"),
    seed: int = option(AffineConfig, "seed", "Seed of the transforms"),
    batch_size: int = option(AffineConfig, "batch_size", "Images per forward pass"),
    device: str = device_option(),
) -> None:
    """Accuracy under affNIST-like affine transforms (rotation +-20, shear +-45 degrees,
    scale 0.8-1.2, translation +-20% of the side), a rotation sweep and flips."""
    from capsmed.evaluate.analyses.affine import analyze_affine

    cfg = AffineConfig(**only_set(split=split, repeats=repeats, sweep_step=sweep_step,
                                  keep_inside=keep_inside, padding=padding,
                                  max_samples=max_samples, seed=seed, batch_size=batch_size))
    result, out = analyze_affine(run_dir, data=data, affnist=affnist, config=cfg,
                                 **only_set(device=device))
    from capsmed.evaluate.analyses.summaries import affine_table

    _show(affine_table(result, cfg.repeats, run_dir))
    _done(out)


@app.command("multimnist")
@handles_errors
def multimnist(
    run_dir: Path = typer.Argument(..., help="A run trained on a capsmed preprocess "
                                   "multimnist file."),
    data: Path = typer.Option(None, help="Another two-label .h5 with the same classes."),
    split: str = typer.Option("test", help="Split to measure."),
    batch_size: int = typer.Option(256, help="Images per forward pass."),
    device: str = device_option(),
) -> None:
    """Two-digit accuracy: both overlaid digits are the two highest class scores
    (Sabour et al.; paper 004 section 3.2)."""
    from capsmed.evaluate.analyses.multimnist import analyze_multimnist

    r, out = analyze_multimnist(run_dir, "auto" if device is None else device, data, split,
                                batch_size)
    from capsmed.evaluate.analyses.summaries import multimnist_table

    _show(multimnist_table(r, split))
    _done(out)


@app.command("routing")
@handles_errors
def routing(
    run_dirs: list[Path] = typer.Argument(..., help="Run directories of capsule networks "
                                          "(several: curves overlaid)."),
    out: Path = typer.Option(None, help="Output folder [first RUN_DIR/analysis/routing]."),
    split: str = typer.Option("test", help="Split for the checkpoint's entropy."),
    batch_size: int = typer.Option(None, help="Images per forward pass [256]."),
    device: str = device_option(),
) -> None:
    """Mean coupling-coefficient entropy over training and against validation accuracy
    (paper 003 Fig. 3), and the kept checkpoint's entropy per class."""
    from capsmed.evaluate.analyses.routing import analyze_routing

    results, folder = analyze_routing(run_dirs, out, "auto" if device is None else device, split,
                                      **only_set(batch_size=batch_size))
    from capsmed.evaluate.analyses.summaries import routing_tables

    _show(*routing_tables(results, split))
    _done(folder)


@app.command("compactness")
@handles_errors
def compactness(
    run_dir: Path = typer.Argument(..., help="A run directory written by capsmed train."),
    factor: list[str] = typer.Option(None, help="rotation, translation (x and y), "
                                     "translation-x, translation-y, scale, shear (x and y), "
                                     "shear-x, shear-y or all; repeatable [all]."),
    steps: int = option(CompactnessConfig, "steps", "Values of the factor per image"),
    data: Path = typer.Option(None, help="Score images of this .h5 instead."),
    split: str = option(CompactnessConfig, "split", "Split to score"),
    padding: str = option(CompactnessConfig, "padding", "zeros, border or reflection"),
    max_samples: int = option(CompactnessConfig, "max_samples", "Score a seeded random "
                              "subset of this size", meaning="all"),
    seed: int = option(CompactnessConfig, "seed", "Seed of that subset"),
    batch_size: int = option(CompactnessConfig, "batch_size", "Source images per forward "
                             "pass"),
    device: str = device_option(),
) -> None:
    """Paper 004's semantic compactness score: KL divergence between the normalised
    per-dimension variance of the true class's capsule (ConvNets: penultimate layer)
    under a factor's changes and a uniform distribution."""
    from capsmed.evaluate.analyses.compactness import analyze_compactness
    from capsmed.evaluate.analyses.configs import expand_factors

    cfg = CompactnessConfig(**only_set(
        factors=expand_factors(factor) if factor else None, steps=steps, split=split,
        padding=padding, max_samples=max_samples, seed=seed, batch_size=batch_size))
    record, out = analyze_compactness(run_dir, cfg, data, **only_set(device=device))
    from capsmed.evaluate.analyses.summaries import compactness_table

    _show(compactness_table(record, run_dir))
    _done(out)


@app.command("manifold")
@handles_errors
def manifold(
    run_dir: Path = typer.Argument(..., help="A run directory written by capsmed train."),
    pairs: int = option(ManifoldConfig, "pairs", "(fixed, moving) digit pairs"),
    radius: int = option(ManifoldConfig, "radius", "Offsets -R..R units per axis (4: a 9x9 "
                         "grid)"),
    step: int = option(ManifoldConfig, "step", "Pixels per unit"),
    perplexity: float = option(ManifoldConfig, "perplexity", "t-SNE perplexity",
                               meaning="min(30, (n-1)/3)"),
    layer: str = option(ManifoldConfig, "layer", "Module whose output is embedded",
                        meaning="class capsules; ConvNets: first fully connected layer"),
    centre: bool = flag(ManifoldConfig, "centre", "Centre both digits by their centre of "
                        "mass first", off="as-stored"),
    data: Path = typer.Option(None, help="Take the digits from this .h5 instead."),
    split: str = option(ManifoldConfig, "split", "Split the digits come from"),
    seed: int = option(ManifoldConfig, "seed", "Seed of the digit choice and t-SNE"),
    device: str = device_option(),
) -> None:
    """Paper 003's two-digit translation grid: t-SNE of a layer's representation and its
    Chamfer distance to the true grid of offsets."""
    from capsmed.evaluate.analyses.manifold import analyze_manifold

    cfg = ManifoldConfig(**only_set(pairs=pairs, radius=radius, step=step,
                                    perplexity=perplexity, layer=layer, centre=centre,
                                    split=split, seed=seed))
    record, out = analyze_manifold(run_dir, cfg, data, **only_set(device=device))
    from capsmed.evaluate.analyses.summaries import manifold_table

    _show(manifold_table(record, run_dir))
    _done(out)


@app.command("transfer")
@handles_errors
def transfer(
    a: Path = typer.Option(..., "--a", help="Dataset .h5 of task A."),
    b: Path = typer.Option(..., "--b", help="Dataset .h5 of task B (the tests)."),
    out: Path = typer.Option(..., *OUTPUT_FLAGS, help="Folder for the base and transfer "
                             "runs and analysis/transfer/."),
    arch: str = typer.Option(None, help="Architecture (optional with --base-a/--base-b)."),
    layers: str = typer.Option(None, help="Ordered layer prefixes L1,L2,... (join several "
                               "with +); k transfers the first k [derived: every layer "
                               "but the class layer]."),
    base_a: Path = typer.Option(None, help="Use this run as the base network of A."),
    base_b: Path = typer.Option(None, help="Use this run as the base network of B."),
    epochs: int = option(TrainConfig, "epochs", "Training epochs of every run"),
    batch_size: int = option(TrainConfig, "batch_size", "Batch size"),
    lr: float = option(TrainConfig, "lr", "Learning rate", meaning="the data's image "
                       "domain's"),
    seed: int = option(TrainConfig, "seed", "Seed of the base runs; transfer runs use "
                       "seed+1"),
    steps_per_epoch: int = option(TrainConfig, "steps_per_epoch", "Batches per epoch",
                                  meaning="one pass"),
    patience: int = option(TrainConfig, "patience", "Early-stop patience"),
    device: str = device_option(),
    model_arg: list[str] = typer.Option(None, help="Architecture option key=value, "
                                        "repeatable."),
    config: Path = typer.Option(None, help="YAML of training options for every run; flags "
                                "override it."),
) -> None:
    """Paper 003's AnB / BnB layer transfer: first k layers from A's (or B's) network
    frozen, the rest retrained on B, all tested on B."""
    from capsmed.evaluate.analyses.transfer import TransferConfig, run_transfer
    from capsmed.train.config import read_options_yaml

    options = read_options_yaml(config) if config else {}
    options.update(only_set(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed,
                            steps_per_epoch=steps_per_epoch, patience=patience,
                            device=device))
    model_kwargs = {**options.get("model_kwargs", {}),
                    **parse_key_values(model_arg, "--model-arg")}
    if model_kwargs:
        options["model_kwargs"] = model_kwargs
    cfg = TransferConfig(a=str(a), b=str(b), out=str(out), arch=arch,
                         layers=tuple(x for x in layers.split(",") if x.strip())
                         if layers is not None else None,  # "": refused, not derived
                         base_a=str(base_a) if base_a else None,
                         base_b=str(base_b) if base_b else None, train_options=options)
    record, folder = run_transfer(cfg)
    from capsmed.evaluate.analyses.summaries import transfer_table

    _show(transfer_table(record))
    _done(folder)
