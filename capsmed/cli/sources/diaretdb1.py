"""DIARETDB1 fundus: ``capsmed synth diaretdb1`` and ``capsmed preprocess diaretdb1``."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set, parse_split_files
from capsmed.cli.options import (
    OUTPUT,
    allow_group_leak_option,
    flag,
    option,
    overwrite_option,
    seed_option,
    split_file_option,
    synth_seed_option,
    workers_option,
)
from capsmed.cli.preprocess import app as preprocess_app
from capsmed.cli.synth import app as synth_app
from capsmed.data.sources.diaretdb1.config import Diaretdb1Config
from capsmed.errors import CapsmedError, shell_quoted


def _pair(text: str | None, option: str) -> tuple[int, int] | None:
    """``"8"`` -> (8, 8); ``"8x6"`` -> (8, 6); None stays None."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", text)
    if not m:
        raise CapsmedError(f"{option} expects N or AxB (e.g. 8x8), got '{text}'")
    return int(m.group(1)), int(m.group(2) or m.group(1))


@synth_app.command("diaretdb1")
@handles_errors
def synth_diaretdb1(
    out_dir: Path = typer.Argument(..., help="Folder to create (must not exist or be "
                                   "empty); it gets resources/ like the v1.1 release."),
    images: int = typer.Option(12, help="Number of images, numbered 001.. (1-89); each "
                               "joins the official list its number is in."),
    size: str = typer.Option("500x384", help="WIDTHxHEIGHT (the release: 1500x1152)."),
    seed: int = synth_seed_option(),
) -> None:
    """Fundus photographs with lesions, fused confidence maps, fmask.tif and split lists."""
    from capsmed.data.sources.diaretdb1.synth import write_diaretdb1

    write_diaretdb1(out_dir, images=images, size=_pair(size, "--size"), seed=seed)


@preprocess_app.command("diaretdb1")
@handles_errors
def preprocess_diaretdb1(
    raw_dir: Path = typer.Argument(..., help="Unpacked DIARETDB1 v1.1: the folder holding "
                                   "resources/ (or the folder holding that one)."),
    output: Path = OUTPUT,
    overwrite: bool = overwrite_option(),
    patch_size: int = option(Diaretdb1Config, "patch_size", "Patch side at source resolution"),
    output_size: int = option(Diaretdb1Config, "output_size", "Side after INTER_AREA resizing"),
    stride: int = option(Diaretdb1Config, "stride", "Step of the grid of candidate patches, px"),
    confidence: float = option(Diaretdb1Config, "confidence", "Ground truth counts where "
                               "value/255 >= this", meaning="the toolkit's standard"),
    lesions: str = option(Diaretdb1Config, "lesions", "Comma-separated lesion types forming "
                          "the lesion class"),
    min_lesion_pixels: int = option(Diaretdb1Config, "min_lesion_pixels", "Lesion pixels a "
                                    "lesion patch needs", meaning="one output pixel's worth: "
                                    "52 at 200->28"),
    min_fov: float = option(Diaretdb1Config, "min_fov", "Min share of a patch inside the "
                            "fundus"),
    lesion_patches_per_component: int = option(Diaretdb1Config,
                                               "lesion_patches_per_component",
                                               "Patches centred on each lesion component; "
                                               "0 = grid only"),
    jitter: int = option(Diaretdb1Config, "jitter", "Max shift of extra lesion-centred "
                         "copies, px", meaning="patch_size / 4"),
    balance: bool = flag(Diaretdb1Config, "balance", "Subsample the larger class of each "
                         "split to the smaller's size"),
    clip_limit: float = option(Diaretdb1Config, "clip_limit", "CLAHE clip limit"),
    tile_grid: str = option(Diaretdb1Config, "tile_grid", "CLAHE tiles, ROWSxCOLS or N",
                            show=lambda grid: "x".join(map(str, grid))),
    val_fraction: float = option(Diaretdb1Config, "val_fraction", "Share of training images "
                                 "moved to validation, by image"),
    split_file: list[str] = split_file_option(  # noqa: B008
        "image", replaces="the official lists"),
    seed: int = seed_option(Diaretdb1Config, "validation images, jitter, balancing"),
    workers: int = workers_option(Diaretdb1Config),
    allow_group_leak: bool = allow_group_leak_option(Diaretdb1Config, "image"),
) -> None:
    """DIARETDB1 fundus: CLAHE green channel, lesion vs healthy patches, official split."""
    from capsmed.data.sources.diaretdb1.reader import preprocess_diaretdb1

    chosen = (tuple(t.strip() for t in lesions.split(",") if t.strip())
              if lesions is not None else None)  # "" names none: refused, not all four
    config = Diaretdb1Config(**only_set(
        patch_size=patch_size, output_size=output_size, stride=stride, confidence=confidence,
        lesions=chosen, min_lesion_pixels=min_lesion_pixels, min_fov=min_fov,
        lesion_patches_per_component=lesion_patches_per_component, jitter=jitter,
        balance=balance, clip_limit=clip_limit, tile_grid=_pair(tile_grid, "--tile-grid"),
        val_fraction=val_fraction, seed=seed, workers=workers,
        split_files=parse_split_files(split_file), allow_group_leak=allow_group_leak))
    path = preprocess_diaretdb1(raw_dir, output, config, overwrite=overwrite)
    echo_wrapped(f"inspect it with: capsmed data info {shell_quoted(path)}")
