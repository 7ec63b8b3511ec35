"""MNIST and Fashion-MNIST: ``capsmed fetch|synth|preprocess mnist|fashion-mnist``."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set
from capsmed.cli.fetch import app as fetch_app
from capsmed.cli.options import OUTPUT, option, overwrite_option, seed_option, synth_seed_option
from capsmed.cli.preprocess import app as preprocess_app
from capsmed.cli.synth import app as synth_app
from capsmed.data.sources.mnist.config import MnistConfig
from capsmed.errors import shell_quoted

_TITLES = {"mnist": "MNIST handwritten digits", "fashion-mnist": "Fashion-MNIST clothing"}


def _register(dataset: str) -> None:
    """Add the three commands for ``dataset`` (the two datasets share everything else)."""
    title = _TITLES[dataset]

    @fetch_app.command(dataset, help=f"{title}: download the four IDX .gz files into "
                       "OUT_DIR, checking each file's published MD5 (resumes partial "
                       "downloads, skips good files).")
    @handles_errors
    def fetch(
        out_dir: Path = typer.Argument(..., help="Folder to download into (created)."),
        mirror: str = typer.Option(None, help="Base URL to download from instead of the "
                                   "built-in mirrors (the file names are appended)."),
        timeout: float = typer.Option(30.0, help="Seconds to wait for a server."),
    ) -> None:
        from capsmed.data.fetch import fetch_dataset
        from capsmed.data.sources.mnist.reader import REMOTE

        paths = fetch_dataset(REMOTE[dataset], out_dir, mirror=mirror, timeout=timeout)
        echo_wrapped(f"{len(paths)} files verified in {out_dir}; next: capsmed preprocess "
                     f"{dataset} {shell_quoted(out_dir)} -o {dataset}.h5")

    @synth_app.command(dataset, help=f"Synthetic {title} in the official IDX files "
                       "(train-*/t10k-* images and labels), for trying the pipeline offline.")
    @handles_errors
    def synth(
        out_dir: Path = typer.Argument(..., help="Folder to create (must not exist or be "
                                       "empty)."),
        train: int = typer.Option(600, help="Training images (real: 60,000)."),
        test: int = typer.Option(100, help="Test images (real: 10,000)."),
        seed: int = synth_seed_option(),
        gzip: bool = typer.Option(True, help="Write .gz files as distributed (--no-gzip: "
                                  "plain IDX)."),
    ) -> None:
        from capsmed.data.sources.mnist.synth import write_mnist_like

        write_mnist_like(out_dir, dataset, train=train, test=test, seed=seed, compress=gzip)

    @preprocess_app.command(dataset, help=f"{title}: IDX files -> HDF5 (train / seeded val / "
                            "test from t10k), optionally placed on a 40x40 canvas.")
    @handles_errors
    def preprocess(
        raw_dir: Path = typer.Argument(..., help="Folder with train-images-idx3-ubyte[.gz], "
                                       "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte"
                                       "[.gz], t10k-labels-idx1-ubyte[.gz]."),
        output: Path = OUTPUT,
        overwrite: bool = overwrite_option(),
        val: float = option(MnistConfig, "val", "Validation images taken from the training "
                            "file: a count (>= 1) or a fraction (< 1); 0 for none"),
        placement: str = option(MnistConfig, "placement", "none (28x28), center40 (padded to "
                                "40x40) or random40 (random position on 40x40, paper 004)"),
        seed: int = seed_option(MnistConfig, "the validation sample and random positions"),
    ) -> None:
        from capsmed.data.sources.mnist.reader import preprocess_mnist

        config = MnistConfig(dataset=dataset,
                             **only_set(val=val, placement=placement, seed=seed))
        path = preprocess_mnist(raw_dir, output, config, overwrite=overwrite)
        echo_wrapped(f"inspect it with: capsmed data info {shell_quoted(path)}")


for _name in _TITLES:
    _register(_name)
