"""``capsmed analyze ...``: the papers' analyses of trained runs (RUN_DIR/analysis/<name>/)."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set, parse_key_values

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
    split: str = typer.Option(None, help="Split to transform [test]."),
    repeats: int = typer.Option(None, help="Random transforms per image [1]."),
    sweep_step: float = typer.Option(None, help="Degrees between rotation-sweep angles [15]."),
    keep_inside: bool = typer.Option(None, "--keep-inside/--free-translation",
                                     help="Narrow shifts so the content stays on the canvas, "
                                     "as affNIST [keep-inside]."),
    padding: str = typer.Option(None, help="zeros (affNIST), border or reflection [zeros]."),
    max_samples: int = typer.Option(None, help="Use a seeded random subset of this size."),
    seed: int = typer.Option(None, help="Seed of the transforms [0]."),
    batch_size: int = typer.Option(None, help="Images per forward pass [256]."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, mps."),
) -> None:
    """Accuracy under affNIST-like affine transforms (rotation +-20, shear +-45 degrees,
    scale 0.8-1.2, translation +-20% of the side), a rotation sweep and flips."""
    from capsmed.evaluate.analyses.affine import AffineConfig, analyze_affine

    cfg = AffineConfig(**only_set(split=split, repeats=repeats, sweep_step=sweep_step,
                                  keep_inside=keep_inside, padding=padding,
                                  max_samples=max_samples, seed=seed, batch_size=batch_size))
    result, out = analyze_affine(run_dir, data=data, affnist=affnist, config=cfg,
                                 device=device)
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
    device: str = typer.Option("auto", help="auto, cpu, cuda, mps."),
) -> None:
    """Two-digit accuracy: both overlaid digits are the two highest class scores
    (Sabour et al.; paper 004 section 3.2)."""
    from capsmed.evaluate.analyses.multimnist import analyze_multimnist

    r, out = analyze_multimnist(run_dir, device, data, split, batch_size)
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
    device: str = typer.Option("auto", help="auto, cpu, cuda, mps."),
) -> None:
    """Mean coupling-coefficient entropy over training and against validation accuracy
    (paper 003 Fig. 3), and the kept checkpoint's entropy per class."""
    from capsmed.evaluate.analyses.routing import analyze_routing

    results, folder = analyze_routing(run_dirs, out, device, split,
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
    steps: int = typer.Option(None, help="Values of the factor per image [11]."),
    data: Path = typer.Option(None, help="Score images of this .h5 instead."),
    split: str = typer.Option(None, help="Split to score [test]."),
    padding: str = typer.Option(None, help="zeros, border or reflection [zeros]."),
    max_samples: int = typer.Option(None, help="Score a seeded random subset of this size."),
    seed: int = typer.Option(None, help="Seed of that subset [0]."),
    batch_size: int = typer.Option(None, help="Source images per forward pass [64]."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, mps."),
) -> None:
    """Paper 004's semantic compactness score: KL divergence between the normalised
    per-dimension variance of the true class's capsule (ConvNets: penultimate layer)
    under a factor's changes and a uniform distribution."""
    from capsmed.evaluate.analyses.compactness import (
        CompactnessConfig,
        analyze_compactness,
        expand_factors,
    )

    cfg = CompactnessConfig(**only_set(
        factors=expand_factors(factor) if factor else None, steps=steps, split=split,
        padding=padding, max_samples=max_samples, seed=seed, batch_size=batch_size))
    record, out = analyze_compactness(run_dir, cfg, data, device)
    from capsmed.evaluate.analyses.summaries import compactness_table

    _show(compactness_table(record, run_dir))
    _done(out)


@app.command("manifold")
@handles_errors
def manifold(
    run_dir: Path = typer.Argument(..., help="A run directory written by capsmed train."),
    pairs: int = typer.Option(None, help="(fixed, moving) digit pairs [5]."),
    radius: int = typer.Option(None, help="Offsets -R..R units per axis [4: a 9x9 grid]."),
    step: int = typer.Option(None, help="Pixels per unit [1]."),
    perplexity: float = typer.Option(None, help="t-SNE perplexity [min(30, (n-1)/3)]."),
    layer: str = typer.Option(None, help="Module whose output is embedded [class capsules; "
                              "ConvNets: first fully connected layer]."),
    centre: bool = typer.Option(None, "--centre/--as-stored", help="Centre both digits by "
                                "their centre of mass first [centre]."),
    data: Path = typer.Option(None, help="Take the digits from this .h5 instead."),
    split: str = typer.Option(None, help="Split the digits come from [test]."),
    seed: int = typer.Option(None, help="Seed of the digit choice and t-SNE [0]."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, mps."),
) -> None:
    """Paper 003's two-digit translation grid: t-SNE of a layer's representation and its
    Chamfer distance to the true grid of offsets."""
    from capsmed.evaluate.analyses.manifold import ManifoldConfig, analyze_manifold

    cfg = ManifoldConfig(**only_set(pairs=pairs, radius=radius, step=step,
                                    perplexity=perplexity, layer=layer, centre=centre,
                                    split=split, seed=seed))
    record, out = analyze_manifold(run_dir, cfg, data, device)
    from capsmed.evaluate.analyses.summaries import manifold_table

    _show(manifold_table(record, run_dir))
    _done(out)


@app.command("transfer")
@handles_errors
def transfer(
    a: Path = typer.Option(..., "--a", help="Dataset .h5 of task A."),
    b: Path = typer.Option(..., "--b", help="Dataset .h5 of task B (the tests)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the base and transfer "
                             "runs and analysis/transfer/."),
    arch: str = typer.Option(None, help="Architecture (optional with --base-a/--base-b)."),
    layers: str = typer.Option(None, help="Ordered layer prefixes L1,L2,... (join several "
                               "with +); k transfers the first k [derived: every layer "
                               "but the class layer]."),
    base_a: Path = typer.Option(None, help="Use this run as the base network of A."),
    base_b: Path = typer.Option(None, help="Use this run as the base network of B."),
    epochs: int = typer.Option(None, help="Training epochs of every run [50]."),
    batch_size: int = typer.Option(None, help="Batch size [128]."),
    lr: float = typer.Option(None, help="Learning rate [paper 000 default]."),
    seed: int = typer.Option(None, help="Seed of the base runs; transfer runs use seed+1 [0]."),
    steps_per_epoch: int = typer.Option(None, help="Batches per epoch [one pass]."),
    patience: int = typer.Option(None, help="Early-stop patience [20]."),
    device: str = typer.Option(None, help="auto, cpu, cuda, mps [auto]."),
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
                         if layers else None,
                         base_a=str(base_a) if base_a else None,
                         base_b=str(base_b) if base_b else None, train_options=options)
    record, folder = run_transfer(cfg)
    from capsmed.evaluate.analyses.summaries import transfer_table

    _show(transfer_table(record))
    _done(folder)
