"""MedMNIST v2 2D sets: ``capsmed fetch|synth|preprocess medmnist``."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set
from capsmed.cli.fetch import app as fetch_app
from capsmed.cli.options import OUTPUT, flag, option, overwrite_option
from capsmed.cli.preprocess import app as preprocess_app
from capsmed.cli.synth import app as synth_app
from capsmed.data.sources.medmnist.config import MedmnistConfig
from capsmed.data.sources.medmnist.sets import SETS, SINGLE_LABEL, SIZES
from capsmed.errors import shell_quoted

_SIZES = ", ".join(map(str, SIZES))


@fetch_app.command("medmnist")
@handles_errors
def fetch_medmnist(
    set_name: str = typer.Argument(..., metavar="SET", help=f"The set: {', '.join(SETS)}."),
    out_dir: Path = typer.Argument(..., help="Folder to download into (created)."),
    size: int = typer.Option(28, help=f"Image side: {_SIZES} (MedMNIST+ above 28)."),
    mirror: str = typer.Option(None, help="Base URL to download from instead of the "
                               "Zenodo record (the file name is appended)."),
    timeout: float = typer.Option(30.0, help="Seconds to wait for a server."),
) -> None:
    """A MedMNIST .npz from its Zenodo record, checked against the published MD5."""
    from capsmed.data.fetch import fetch_dataset
    from capsmed.data.sources.medmnist.reader import remote

    paths = fetch_dataset(remote(set_name, size), out_dir, mirror=mirror, timeout=timeout)
    echo_wrapped(f"{paths[0]} verified; next: capsmed preprocess medmnist {shell_quoted(paths[0])} "
                 f"-o {set_name}.h5")


@synth_app.command("medmnist")
@handles_errors
def synth_medmnist(
    out_dir: Path = typer.Argument(..., help="Folder to write <set>[_<size>].npz into "
                                   "(created; other files are left alone)."),
    set_name: str = typer.Option("bloodmnist", "--set", help="Single-label 2D set whose "
                                 f"classes and channels to use: {', '.join(SINGLE_LABEL)}."),
    size: int = typer.Option(28, help=f"Image side: {_SIZES}."),
    train: int = typer.Option(240, help="Training images."),
    val: int = typer.Option(40, help="Validation images."),
    test: int = typer.Option(80, help="Test images."),
    seed: int = typer.Option(0, help="Random seed; same seed, same file."),
) -> None:
    """Class-coded discs in a MedMNIST .npz (the published arrays, dtypes and shapes)."""
    from capsmed.data.sources.medmnist.synth import write_medmnist

    # its "wrote <file> (train=..., ...)" is logged once, by the writer
    write_medmnist(out_dir, set_name=set_name, size=size, train=train, val=val, test=test,
                   seed=seed)


@preprocess_app.command("medmnist")
@handles_errors
def preprocess_medmnist(
    npz_file: Path = typer.Argument(..., help="A MedMNIST file as published: <set>.npz "
                                    "or <set>_64|128|224.npz."),
    output: Path = OUTPUT,
    overwrite: bool = overwrite_option(),
    set_name: str = option(MedmnistConfig, "set_name", "The set the file holds", "--set",
                           meaning="from the file name"),
    ordinal_as_classes: bool = flag(MedmnistConfig, "ordinal_as_classes", "Train "
                                    "RetinaMNIST's ordinal grades as classes, as the "
                                    "MedMNIST benchmark does"),
    domain: str = option(MedmnistConfig, "domain", "What the images show (digits, objects, "
                         "histology, fundus, cytology, generic), recorded in the file: "
                         "training's default lr and --augment recipe follow it",
                         meaning="the set's: bloodmnist and tissuemnist cytology, "
                         "pathmnist histology, retinamnist fundus, the rest generic"),
) -> None:
    """MedMNIST 2D: the official train/val/test splits, images as published."""
    from capsmed.data.sources.medmnist.reader import preprocess_medmnist as run

    config = MedmnistConfig(**only_set(set_name=set_name,
                                       ordinal_as_classes=ordinal_as_classes, domain=domain))
    path = run(npz_file, output, config, overwrite=overwrite)
    echo_wrapped(f"inspect it with: capsmed data info {shell_quoted(path)}")  # "wrote" is logged
