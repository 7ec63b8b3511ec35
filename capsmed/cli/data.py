"""``capsmed data``: inspect dataset files."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import fit_to_width, handles_errors

app = typer.Typer(help="Inspect HDF5 dataset files.", no_args_is_help=True)


@app.command("info")
@handles_errors
def info(file: Path = typer.Argument(..., help="A dataset .h5 written by capsmed.")) -> None:
    """Splits, class counts per split, groups, the leak check and every parameter."""
    from rich.console import Console

    from capsmed.data.describe import describe_dataset

    console = Console()
    console.print(fit_to_width(describe_dataset(file), console.width))


@app.command("preview")
@handles_errors
def preview(
    file: Path = typer.Argument(..., help="A dataset .h5 written by capsmed."),
    output: Path = typer.Option(..., "--output", "-o", help="Image to write (.png; .pdf, "
                                ".svg, .jpg also work)."),
    split: str = typer.Option(None, help="Split to show [train, else the first split]."),
    per_class: int = typer.Option(None, help="Random samples per class [8]."),
    seed: int = typer.Option(None, help="Seed for choosing the samples [0]."),
) -> None:
    """A grid of random samples: one row per class (name, count), group/fold captions."""
    from capsmed.cli.common import only_set
    from capsmed.data.preview import preview_dataset

    # the library logs 'wrote PATH (size; split)': not said a second time here
    preview_dataset(file, output, **only_set(split=split, per_class=per_class, seed=seed))
