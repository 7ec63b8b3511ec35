"""MultiMNIST: ``capsmed preprocess multimnist`` (generated from the MNIST IDX files)."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set
from capsmed.cli.options import OUTPUT, flag, option, overwrite_option, seed_option
from capsmed.cli.preprocess import app as preprocess_app
from capsmed.data.sources.mnist.config import MultiMnistConfig
from capsmed.errors import shell_quoted


@preprocess_app.command("multimnist")
@handles_errors
def preprocess_multimnist(
    mnist_dir: Path = typer.Argument(..., help="Folder with the four MNIST IDX files "
                                     "(.gz or plain)."),
    output: Path = OUTPUT,
    overwrite: bool = overwrite_option(),
    pairs: int = option(MultiMnistConfig, "pairs", "Samples per training image (Sabour et "
                        "al.: 1000)"),
    eval_pairs: int = option(MultiMnistConfig, "eval_pairs", "Samples per val/test image",
                             meaning="same as --pairs"),
    shift: int = option(MultiMnistConfig, "shift", "Max shift of each digit per axis, px; "
                        "canvas is 28+2*shift"),
    val: float = option(MultiMnistConfig, "val", "Validation images from the training file: "
                        "a count (>= 1) or a fraction (< 1)"),
    store_sources: bool = flag(MultiMnistConfig, "store_sources", "Also store both shifted "
                               "digits (for the reconstruction loss)"),
    seed: int = seed_option(MultiMnistConfig, "val sample, partners and shifts"),
) -> None:
    """Two overlapping digits of different classes (Sabour et al.), pairs within a split."""
    from capsmed.data.sources.mnist.multimnist import preprocess_multimnist as run

    config = MultiMnistConfig(**only_set(pairs=pairs, eval_pairs=eval_pairs, shift=shift,
                                         val=val, store_sources=store_sources, seed=seed))
    out = run(mnist_dir, output, config, overwrite=overwrite)
    echo_wrapped(f"inspect it with: capsmed data info {shell_quoted(out)}")
