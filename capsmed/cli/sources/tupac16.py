"""TUPAC16 mitosis: ``capsmed synth tupac16`` and ``capsmed preprocess tupac16``."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set, parse_split_files
from capsmed.cli.options import (
    OUTPUT,
    allow_group_leak_option,
    allow_no_annotations_option,
    fraction_option,
    option,
    overwrite_option,
    seed_option,
    split_file_option,
    split_fractions,
    synth_seed_option,
    workers_option,
)
from capsmed.cli.preprocess import app as preprocess_app
from capsmed.cli.stain_options import stain_norm_option, stain_target_option
from capsmed.cli.synth import app as synth_app
from capsmed.data.sources.tupac16.config import Tupac16Config
from capsmed.errors import shell_quoted


@synth_app.command("tupac16")
@handles_errors
def synth_tupac16(
    out_dir: Path = typer.Argument(..., help="Folder to create (must not exist or be empty)."),
    cases: int = typer.Option(6, help="Number of cases (01..73)."),
    images_per_case: int = typer.Option(4, help="Images per case."),
    size: int = typer.Option(512, help="Image side in pixels (real AMIDA images: 2000)."),
    seed: int = synth_seed_option(),
    layout: str = typer.Option("official", help="official (mitoses_image_data_part_N + "
                               "mitoses_ground_truth) or flat (CSV beside each TIF)."),
) -> None:
    """H&E mitosis images (Beer-Lambert stain model) with row,col ground-truth CSVs."""
    from capsmed.data.sources.tupac16.synth import write_tupac16

    write_tupac16(out_dir, cases=cases, images_per_case=images_per_case, size=size,
                  seed=seed, layout=layout)


@preprocess_app.command("tupac16")
@handles_errors
def preprocess_tupac16(
    raw_dir: Path = typer.Argument(..., help="Unpacked TUPAC16 mitosis data (official "
                                   "mitoses_image_data_part_N/ + mitoses_ground_truth/, or "
                                   "<CC>/<NN>.tif with <NN>.csv beside)."),
    output: Path = OUTPUT,
    overwrite: bool = overwrite_option(),
    patch_size: int = option(Tupac16Config, "patch_size", "Patch side at source resolution"),
    output_size: int = option(Tupac16Config, "output_size", "Side after resizing"),
    jitter: int = option(Tupac16Config, "jitter", "Max translation of jittered positives, px"),
    positives_per_mitosis: int = option(Tupac16Config, "positives_per_mitosis",
                                        "Patches per mitosis: one centred, the rest jittered"),
    negatives_per_image: int = option(Tupac16Config, "negatives_per_image",
                                      "Negative patches per image",
                                      meaning="balance the classes in each split"),
    min_tissue: float = option(Tupac16Config, "min_tissue", "Min tissue fraction of a negative"),
    mitosis_radius: int = option(Tupac16Config, "mitosis_radius", "Margin a negative patch keeps "
                                 "around every mitosis, px"),
    h_max: float = option(Tupac16Config, "h_max", "Hematoxylin density mapped to black"),
    train: float = fraction_option(Tupac16Config, "train", "case"),
    val: float = fraction_option(Tupac16Config, "val", "case"),
    test: float = fraction_option(Tupac16Config, "test", "case"),
    split_file: list[str] = split_file_option("case"),  # noqa: B008
    seed: int = seed_option(Tupac16Config, "the split, jitter and sampling"),
    workers: int = workers_option(Tupac16Config),
    allow_group_leak: bool = allow_group_leak_option(Tupac16Config, "case"),
    allow_no_annotations: bool = allow_no_annotations_option(Tupac16Config,
                                                             "mitosis annotation"),
    stain_norm: str = stain_norm_option(Tupac16Config),
    stain_target: str = stain_target_option(Tupac16Config),
) -> None:
    """TUPAC16 mitosis: hematoxylin channel, mitosis vs tissue patches, case-level split."""
    from capsmed.data.sources.tupac16.reader import preprocess_tupac16

    fractions = split_fractions(Tupac16Config, train, val, test)
    config = Tupac16Config(**only_set(
        stain_norm=stain_norm,
        stain_target=stain_target,
        patch_size=patch_size, output_size=output_size, jitter=jitter,
        positives_per_mitosis=positives_per_mitosis, negatives_per_image=negatives_per_image,
        min_tissue=min_tissue, mitosis_radius=mitosis_radius, h_max=h_max, seed=seed,
        workers=workers, fractions=fractions,
        split_files=parse_split_files(split_file, fractions),
        allow_group_leak=allow_group_leak,
        allow_no_annotations=allow_no_annotations))
    path = preprocess_tupac16(raw_dir, output, config, overwrite=overwrite)
    echo_wrapped(f"inspect it with: capsmed data info {shell_quoted(path)}")
