"""``capsmed data``: inspect dataset files."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import handles_errors

app = typer.Typer(help="Inspect HDF5 dataset files.", no_args_is_help=True)


@app.command("info")
@handles_errors
def info(file: Path = typer.Argument(..., help="A dataset .h5 written by capsmed.")) -> None:
    """Splits, class counts per split, groups, the leak check and every parameter."""
    from rich.console import Console

    from capsmed.data.describe import describe_dataset

    Console().print(describe_dataset(file))
