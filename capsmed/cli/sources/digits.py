"""scikit-learn's handwritten digits: ``capsmed preprocess digits`` (real scans that
ship with scikit-learn: no download, no synth)."""

from __future__ import annotations

from pathlib import Path

from capsmed.cli.common import echo_wrapped, handles_errors, only_set
from capsmed.cli.options import (
    OUTPUT,
    fraction_option,
    option,
    overwrite_option,
    seed_option,
    split_fractions,
)
from capsmed.cli.preprocess import app as preprocess_app
from capsmed.data.sources.digits.config import DigitsConfig
from capsmed.errors import shell_quoted


@preprocess_app.command("digits")
@handles_errors
def preprocess_digits(
    output: Path = OUTPUT,
    overwrite: bool = overwrite_option(),
    size: int = option(DigitsConfig, "size", "Output side (MNIST: 28)"),
    box: int = option(DigitsConfig, "box", "Side the 8x8 scan is enlarged to, centred on "
                      "black (MNIST: 20)"),
    train: float = fraction_option(DigitsConfig, "train", "image"),
    val: float = fraction_option(DigitsConfig, "val", "image"),
    test: float = fraction_option(DigitsConfig, "test", "image"),
    seed: int = seed_option(DigitsConfig, "the split"),
) -> None:
    """scikit-learn's 1,797 real 8x8 digit scans (load_digits, no download), enlarged
    to 28x28 like MNIST, stratified split."""
    from capsmed.data.sources.digits.reader import preprocess_digits as run

    config = DigitsConfig(**only_set(size=size, box=box, seed=seed,
                                     fractions=split_fractions(DigitsConfig, train, val,
                                                               test)))
    path = run(None, output, config, overwrite=overwrite)
    echo_wrapped(f"inspect it with: capsmed data info {shell_quoted(path)}")  # "wrote" is logged
