"""DIARETDB1 fundus: ``capsmed synth diaretdb1`` and ``capsmed preprocess diaretdb1``."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from capsmed.cli.common import handles_errors, only_set, parse_split_files
from capsmed.cli.preprocess import app as preprocess_app
from capsmed.cli.synth import app as synth_app
from capsmed.errors import CapsmedError


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
    seed: int = typer.Option(0, help="Random seed; same seed, same files."),
) -> None:
    """Fundus photographs with lesions, fused confidence maps, fmask.tif and split lists."""
    from capsmed.data.synth.diaretdb1 import write_diaretdb1

    summary = write_diaretdb1(out_dir, images=images, size=_pair(size, "--size"), seed=seed)
    lesions = ", ".join(f"{v} {k}" for k, v in summary.lesions.items())
    typer.echo(f"wrote {summary.images} images ({summary.train} train, {summary.test} test; "
               f"{lesions}) to {summary.root}")


@preprocess_app.command("diaretdb1")
@handles_errors
def preprocess_diaretdb1(
    raw_dir: Path = typer.Argument(..., help="Unpacked DIARETDB1 v1.1: the folder holding "
                                   "resources/ (or the folder holding that one)."),
    output: Path = typer.Option(..., "--output", "-o", help="The .h5 file to write."),
    patch_size: int = typer.Option(None, help="Patch side at source resolution [200]."),
    output_size: int = typer.Option(None, help="Side after INTER_AREA resizing [28]."),
    stride: int = typer.Option(None, help="Step of the grid of candidate patches, px [100]."),
    confidence: float = typer.Option(None, help="Ground truth counts where value/255 >= "
                                     "this [0.75, the toolkit's standard]."),
    lesions: str = typer.Option(None, help="Comma-separated lesion types forming the lesion "
                                "class [hardexudates,softexudates,hemorrhages,redsmalldots]."),
    min_lesion_pixels: int = typer.Option(None, help="Lesion pixels a lesion patch needs "
                                          "[one output pixel's worth: 52 at 200->28]."),
    min_fov: float = typer.Option(None, help="Min share of a patch inside the fundus [0.75]."),
    lesion_patches_per_component: int = typer.Option(None, help="Patches centred on each "
                                                     "lesion component; 0 = grid only [1]."),
    jitter: int = typer.Option(None, help="Max shift of extra lesion-centred copies, px "
                               "[patch_size / 4]."),
    balance: bool = typer.Option(None, "--balance/--no-balance", help="Subsample the larger "
                                 "class of each split to the smaller's size [balance]."),
    clip_limit: float = typer.Option(None, help="CLAHE clip limit [3]."),
    tile_grid: str = typer.Option(None, help="CLAHE tiles, ROWSxCOLS or N [8x8]."),
    val_fraction: float = typer.Option(None, help="Share of training images moved to "
                                       "validation, by image [0.15]."),
    split_file: list[str] = typer.Option(None, help="SPLIT=FILE image list replacing the "
                                         "official ones; repeat for train, val, test."),
    seed: int = typer.Option(None, help="Seed for validation images, jitter, balancing [0]."),
    workers: int = typer.Option(None, help="Worker processes [one per CPU, up to 8]."),
    allow_group_leak: bool = typer.Option(False, help="Write even if an image is in two "
                                          "splits (not recommended)."),
) -> None:
    """DIARETDB1 fundus: CLAHE green channel, lesion vs healthy patches, official split."""
    from capsmed.data.sources.diaretdb1 import Diaretdb1Config, preprocess_diaretdb1

    files = parse_split_files(split_file)
    chosen = tuple(t.strip() for t in lesions.split(",") if t.strip()) if lesions else None
    config = Diaretdb1Config(**only_set(
        patch_size=patch_size, output_size=output_size, stride=stride, confidence=confidence,
        lesions=chosen, min_lesion_pixels=min_lesion_pixels, min_fov=min_fov,
        lesion_patches_per_component=lesion_patches_per_component, jitter=jitter,
        balance=balance, clip_limit=clip_limit, tile_grid=_pair(tile_grid, "--tile-grid"),
        val_fraction=val_fraction, seed=seed, workers=workers,
        split_files=files),
        allow_group_leak=allow_group_leak)
    path = preprocess_diaretdb1(raw_dir, output, config)
    typer.echo(f"wrote {path}; inspect it with: capsmed data info {path}")
