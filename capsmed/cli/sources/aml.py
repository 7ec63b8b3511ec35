"""AML-Cytomorphology_LMU leukocytes: ``capsmed synth aml`` and ``capsmed preprocess aml``."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set
from capsmed.cli.options import (
    OUTPUT,
    flag,
    option,
    overwrite_option,
    seed_option,
    synth_seed_option,
    workers_option,
)
from capsmed.cli.preprocess import app as preprocess_app
from capsmed.cli.synth import app as synth_app
from capsmed.data.sources.aml.config import AmlConfig
from capsmed.errors import shell_quoted


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
    seed: int = synth_seed_option(),
) -> None:
    """Single leukocytes of the 15 classes (RGBA TIFF) plus annotations.dat."""
    from capsmed.data.sources.aml.synth import write_aml

    write_aml(out_dir, per_class_scale=per_class_scale, size=size, seed=seed,
              min_per_class=min_per_class, reannotated_fraction=reannotated)


@preprocess_app.command("aml")
@handles_errors
def preprocess_aml(
    raw_dir: Path = typer.Argument(..., help="Folder holding AML-Cytomorphology/ and "
                                   "annotations.dat, or AML-Cytomorphology/ itself "
                                   "(annotations.dat inside or beside it)."),
    output: Path = OUTPUT,
    overwrite: bool = overwrite_option(),
    size: int = option(AmlConfig, "size", "Output side in pixels, INTER_AREA"),
    grey: bool = flag(AmlConfig, "grey", "One luma channel instead of RGB", off="colour"),
    labels: str = option(AmlConfig, "labels", "original: every image, original label; "
                         "agreed: drop images whose re-annotations disagree or are UNC"),
    folds: int = option(AmlConfig, "folds", "Stratified cross-validation folds"),
    seed: int = seed_option(AmlConfig, "the fold assignment"),
    annotations: Path = typer.Option(None, help="annotations.dat, if it is elsewhere.",
                                     show_default=False),
    workers: int = workers_option(AmlConfig),
) -> None:
    """AML-Cytomorphology_LMU: 15 leukocyte classes, RGB(A) -> resized, stratified k folds."""
    from capsmed.data.sources.aml.reader import preprocess_aml

    config = AmlConfig(**only_set(size=size, grey=grey, labels=labels, folds=folds, seed=seed,
                                  workers=workers))
    path = preprocess_aml(raw_dir, output, config, annotations=annotations,
                          overwrite=overwrite)
    echo_wrapped(f"inspect it with: capsmed data info {shell_quoted(path)}")
