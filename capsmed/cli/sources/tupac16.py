"""TUPAC16 mitosis: ``capsmed synth tupac16`` and ``capsmed preprocess tupac16``."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import handles_errors, only_set, parse_split_files
from capsmed.cli.preprocess import app as preprocess_app
from capsmed.cli.synth import app as synth_app


@synth_app.command("tupac16")
@handles_errors
def synth_tupac16(
    out_dir: Path = typer.Argument(..., help="Folder to create (must not exist or be empty)."),
    cases: int = typer.Option(6, help="Number of cases (01..73)."),
    images_per_case: int = typer.Option(4, help="Images per case."),
    size: int = typer.Option(512, help="Image side in pixels (real AMIDA images: 2000)."),
    seed: int = typer.Option(0, help="Random seed; same seed, same files."),
    layout: str = typer.Option("official", help="official (mitoses_image_data_part_N + "
                               "mitoses_ground_truth) or flat (CSV beside each TIF)."),
) -> None:
    """H&E mitosis images (Beer-Lambert stain model) with row,col ground-truth CSVs."""
    from capsmed.data.synth.tupac16 import write_tupac16

    summary = write_tupac16(out_dir, cases=cases, images_per_case=images_per_case, size=size,
                            seed=seed, layout=layout)
    typer.echo(f"wrote {summary.images} images ({summary.mitoses} mitoses, "
               f"{summary.cases} cases) to {summary.root}")


@preprocess_app.command("tupac16")
@handles_errors
def preprocess_tupac16(
    raw_dir: Path = typer.Argument(..., help="Unpacked TUPAC16 mitosis data (official "
                                   "mitoses_image_data_part_N/ + mitoses_ground_truth/, or "
                                   "<CC>/<NN>.tif with <NN>.csv beside)."),
    output: Path = typer.Option(..., "--output", "-o", help="The .h5 file to write."),
    patch_size: int = typer.Option(None, help="Patch side at source resolution [100]."),
    output_size: int = typer.Option(None, help="Side after resizing [28]."),
    jitter: int = typer.Option(None, help="Max translation of jittered positives, px [30]."),
    positives_per_mitosis: int = typer.Option(None, help="Patches per mitosis: one centred, "
                                              "the rest jittered [20]."),
    negatives_per_image: int = typer.Option(None, help="Negative patches per image "
                                            "[balance the classes in each split]."),
    min_tissue: float = typer.Option(None, help="Min tissue fraction of a negative [0.5]."),
    h_max: float = typer.Option(None, help="Hematoxylin density mapped to black [0.2]."),
    train: float = typer.Option(0.7, help="Fraction of cases for training."),
    val: float = typer.Option(0.15, help="Fraction of cases for validation."),
    test: float = typer.Option(0.15, help="Fraction of cases for testing."),
    split_file: list[str] = typer.Option(None, help="SPLIT=FILE listing case ids, one per "
                                         "line; repeat for train, val, test. Overrides "
                                         "the fractions."),
    seed: int = typer.Option(None, help="Seed for the split, jitter and sampling [0]."),
    workers: int = typer.Option(None, help="Worker processes [one per CPU, up to 8]."),
    allow_group_leak: bool = typer.Option(False, help="Write even if a case is in two "
                                          "splits (not recommended)."),
) -> None:
    """TUPAC16 mitosis: hematoxylin channel, mitosis vs tissue patches, case-level split."""
    from capsmed.data.sources.tupac16 import Tupac16Config, preprocess_tupac16

    files = parse_split_files(split_file)
    config = Tupac16Config(**only_set(
        patch_size=patch_size, output_size=output_size, jitter=jitter,
        positives_per_mitosis=positives_per_mitosis, negatives_per_image=negatives_per_image,
        min_tissue=min_tissue, h_max=h_max, seed=seed, workers=workers,
        split_files=files),
        fractions={"train": train, "val": val, "test": test},
        allow_group_leak=allow_group_leak)
    path = preprocess_tupac16(raw_dir, output, config)
    typer.echo(f"wrote {path}; inspect it with: capsmed data info {path}")
