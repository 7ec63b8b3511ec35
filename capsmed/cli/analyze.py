"""``capsmed analyze ...``: the papers' analyses of trained runs (RUN_DIR/analysis/<name>/)."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set, parse_key_values

app = typer.Typer(help="Analyses of trained runs: affine robustness, MultiMNIST two-digit "
                  "accuracy, routing entropy, semantic compactness, t-SNE manifold, "
                  "layer transfer.",
                  no_args_is_help=True)


def _print_table(title: str, header: list[str], rows: list[list[str]],
                 caption: str | None = None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), caption=escape(caption) if caption else None)
    for i, name in enumerate(header):
        table.add_column(escape(name), justify="left" if i == 0 else "right", overflow="fold")
    for row in rows:
        table.add_row(*(escape(str(cell)) for cell in row))
    Console().print(table)


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
    rows = [["untransformed", f"{result.clean_accuracy:.4f}", str(result.samples)],
            ["random affine", f"{result.affine_accuracy:.4f}",
             str(result.samples * cfg.repeats)]]
    rows += [[f"{name} (unchanged {v['unchanged']:.3f})", f"{v['accuracy']:.4f}",
              str(result.samples)] for name, v in result.flips.items()]
    if result.affnist is not None:
        rows.append(["affNIST file", f"{result.affnist['accuracy']:.4f}",
                     str(result.affnist["samples"])])
    worst = min(range(len(result.sweep_angles)), key=result.sweep_accuracy.__getitem__)
    _print_table(f"Affine robustness: {run_dir}", ["condition", "accuracy", "images"], rows,
                 caption=f"rotation sweep: worst {result.sweep_accuracy[worst]:.3f} at "
                 f"{result.sweep_angles[worst]:+.0f} deg; mean applied shift "
                 f"{result.mean_abs_translation_px:.2f} px")
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
    rows = [["two-digit accuracy", f"{r.two_digit_accuracy:.4f}"],
            ["first digit in top 2", f"{r.first_found:.4f}"],
            ["second digit in top 2", f"{r.second_found:.4f}"]]
    rows += [[f"  class {name} found", f"{v:.4f}"] for name, v in r.per_class_found.items()]
    _print_table(f"MultiMNIST on {split} ({r.samples} images)", ["measure", "value"], rows)
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
    rows = []
    for r in results:
        ends = [f"{p['routing_entropy']:.4f}" for p in (r.curve[:1] + r.curve[-1:])]
        rows.append([r.run_dir, r.arch, f"{r.layer} ({r.lower_capsules}->{r.upper_capsules})",
                     *(ends or ["-", "-"]), f"{r.test_entropy:.4f}",
                     f"{r.test_normalised:.4f}"])
        for name, v in r.per_class.items():
            rows.append([f"  class {name}", "", "", "", "", f"{v['entropy']:.4f}",
                         f"{v['normalised']:.4f}"])
    _print_table("Routing coupling entropy (nats)",
                 ["run", "arch", "layer (I->J)", "first epoch", "last epoch", split,
                  "/ log J"], rows, caption="epochs: validation split, as logged")
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
    rows = [[f, f"{r['score']:.4f}", f"{r['std']:.4f}", str(r["samples"]),
             str(r["undefined"])] for f, r in record["factors"].items()]
    top = next(iter(record["factors"].values()))["max_score"]
    _print_table(f"Semantic compactness: {run_dir}",
                 ["factor", "score", "std", "samples", "undefined"], rows,
                 caption=f"{record['representation']}; maximum log D = {top:.3f}")
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
    rows = [[f"{r['fixed_class']} + moving {r['moving_class']}", f"{r['chamfer']:.4f}",
             f"{r['aligned_error']:.4f}"] for r in record["pairs"]]
    rows.append(["mean", f"{record['chamfer_mean']:.4f}",
                 f"{record['aligned_error_mean']:.4f}"])
    _print_table(f"Manifold (t-SNE, {record['grid_points']} images per pair): {run_dir}",
                 ["fixed + moving", "Chamfer", "aligned error"], rows,
                 caption=f"{record['representation']}; Chamfer variance "
                 f"{record['chamfer_variance']:.4f}")
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
    rows = [[r["scheme"], str(r["k"]), r["layers"] or "-", f"{r['accuracy']:.4f}"]
            for r in record["results"]]
    _print_table(f"Layer transfer ({record['arch']}), accuracy on B's test split",
                 ["scheme", "k", "frozen layers", "accuracy"], rows,
                 caption=f"base A on A's test split: {record['base_a_accuracy_on_a']:.4f}")
    _done(folder)
