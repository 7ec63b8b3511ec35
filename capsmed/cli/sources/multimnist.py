"""MultiMNIST: ``capsmed preprocess multimnist`` (generated from the MNIST IDX files)."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import handles_errors, only_set
from capsmed.cli.preprocess import app as preprocess_app


@preprocess_app.command("multimnist")
@handles_errors
def preprocess_multimnist(
    mnist_dir: Path = typer.Argument(..., help="Folder with the four MNIST IDX files "
                                     "(.gz or plain)."),
    output: Path = typer.Option(..., "--output", "-o", help="The .h5 file to write."),
    pairs: int = typer.Option(None, help="Samples per training image (Sabour et al.: "
                              "1000) [1]."),
    eval_pairs: int = typer.Option(None, help="Samples per val/test image [same as "
                                   "--pairs]."),
    shift: int = typer.Option(None, help="Max shift of each digit per axis, px; canvas is "
                              "28+2*shift [4]."),
    val: float = typer.Option(None, help="Validation images from the training file: a "
                              "count (>= 1) or a fraction (< 1) [5000]."),
    store_sources: bool = typer.Option(None, "--store-sources/--no-store-sources",
                                       help="Also store both shifted digits (for the "
                                       "reconstruction loss) [store]."),
    seed: int = typer.Option(None, help="Seed for val sample, partners and shifts [0]."),
) -> None:
    """Two overlapping digits of different classes (Sabour et al.), pairs within a split."""
    from capsmed.data.sources.multimnist import MultiMnistConfig
    from capsmed.data.sources.multimnist import preprocess_multimnist as run

    config = MultiMnistConfig(**only_set(pairs=pairs, eval_pairs=eval_pairs, shift=shift,
                                         val=val, store_sources=store_sources, seed=seed))
    out = run(mnist_dir, output, config)
    typer.echo(f"wrote {out}; inspect it with: capsmed data info {out}")
