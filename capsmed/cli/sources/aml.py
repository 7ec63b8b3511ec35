"""AML-Cytomorphology_LMU leukocytes: ``capsmed synth aml`` and ``capsmed preprocess aml``."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import handles_errors, only_set
from capsmed.cli.preprocess import app as preprocess_app
from capsmed.cli.synth import app as synth_app


@synth_app.command("aml")
@handles_errors
def synth_aml(
    out_dir: Path = typer.Argument(..., help="Folder to create (must not exist or be empty)."),
    per_class_scale: float = typer.Option(0.005, help="Fraction of the release's images per "
                                          "class (0.005: 42 NGS ... 2 of each rare class)."),
    min_per_class: int = typer.Option(2, help="At least this many images per class."),
    size: int = typer.Option(400, help="Image side in pixels (the release: 400)."),
    reannotated: float = typer.Option(0.2, help="Share of images with two re-annotations "
                                      "(agreeing, disagreeing or UNC)."),
    seed: int = typer.Option(0, help="Random seed; same seed, same files."),
) -> None:
    """Single leukocytes of the 15 classes (RGBA TIFF) plus annotations.dat."""
    from capsmed.data.synth.aml import write_aml

    summary = write_aml(out_dir, per_class_scale=per_class_scale, size=size, seed=seed,
                        min_per_class=min_per_class, reannotated_fraction=reannotated)
    typer.echo(f"wrote {summary.images} images of 15 classes to {summary.root}")


@preprocess_app.command("aml")
@handles_errors
def preprocess_aml(
    raw_dir: Path = typer.Argument(..., help="Folder holding AML-Cytomorphology/ and "
                                   "annotations.dat, or AML-Cytomorphology/ itself "
                                   "(annotations.dat inside or beside it)."),
    output: Path = typer.Option(..., "--output", "-o", help="The .h5 file to write."),
    size: int = typer.Option(None, help="Output side in pixels, INTER_AREA [28]."),
    grey: bool = typer.Option(None, "--grey/--colour", help="One luma channel instead of "
                              "RGB (default: colour)."),
    labels: str = typer.Option(None, help="original: every image, original label; agreed: "
                               "drop images whose re-annotations disagree or are UNC "
                               "(default: original)."),
    folds: int = typer.Option(None, help="Stratified cross-validation folds [5]."),
    seed: int = typer.Option(None, help="Seed of the fold assignment [0]."),
    annotations: Path = typer.Option(None, help="annotations.dat, if it is elsewhere."),
    workers: int = typer.Option(None, help="Worker processes (default: one per CPU, "
                                 "up to 8)."),
) -> None:
    """AML-Cytomorphology_LMU: 15 leukocyte classes, RGB(A) -> resized, stratified k folds."""
    from capsmed.data.sources.aml import AmlConfig, preprocess_aml

    config = AmlConfig(**only_set(size=size, grey=grey, labels=labels, folds=folds, seed=seed,
                                  workers=workers))
    path = preprocess_aml(raw_dir, output, config, annotations=annotations)
    typer.echo(f"wrote {path}; inspect it with: capsmed data info {path}")
