"""affNIST: ``capsmed synth affnist`` and ``capsmed preprocess affnist``."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set
from capsmed.cli.options import OUTPUT, option, overwrite_option, synth_seed_option
from capsmed.cli.preprocess import app as preprocess_app
from capsmed.cli.synth import app as synth_app
from capsmed.data.sources.mnist.config import AffnistConfig
from capsmed.errors import CapsmedError, shell_quoted


@synth_app.command("affnist")
@handles_errors
def synth_affnist(
    out_dir: Path = typer.Argument(..., help="Folder to create (must not exist or be empty)."),
    count: int = typer.Option(200, help="Images (real test set: 320,000)."),
    batches: int = typer.Option(4, help="Files in test_batches/ (real: 32)."),
    seed: int = synth_seed_option(),
    mat_version: str = typer.Option("5", help="MAT-file version: 5 (as distributed) or 7.3 "
                                    "(HDF5-based)."),
) -> None:
    """affNIST-style test.mat and test_batches/<k>.mat: digits under random affine maps."""
    from capsmed.data.sources.mnist.synth import write_affnist

    if mat_version not in ("5", "7.3"):
        raise CapsmedError(f"--mat-version must be 5 or 7.3, got {mat_version!r}")
    write_affnist(out_dir, count=count, batches=batches, seed=seed, version=mat_version)


@preprocess_app.command("affnist")
@handles_errors
def preprocess_affnist(
    path: Path = typer.Argument(..., help="affNIST test.mat, or a folder of batches such as "
                                "test_batches/ (1.mat, 2.mat, ...)."),
    output: Path = OUTPUT,
    overwrite: bool = overwrite_option(),
    split: str = option(AffnistConfig, "split", "Split to store the images under"),
    max_images: int = option(AffnistConfig, "max_images", "Keep only the first N images",
                             meaning="all"),
) -> None:
    """affNIST (40x40 affine-transformed MNIST) -> HDF5, a test set for models trained
    on `preprocess mnist --placement random40`."""
    from capsmed.data.sources.mnist.affnist import preprocess_affnist as run

    out = run(path, output, AffnistConfig(**only_set(split=split, max_images=max_images)),
              overwrite=overwrite)
    echo_wrapped(f"inspect it with: capsmed data info {shell_quoted(out)}")
