"""``capsmed data``: inspect dataset files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from capsmed.cli.common import fit_to_width, handles_errors
from capsmed.cli.json_output import json_option, print_json
from capsmed.cli.options import OUTPUT_FLAGS

app = typer.Typer(help="Inspect HDF5 dataset files.", no_args_is_help=True)


@app.command("info")
@handles_errors
def info(file: Path = typer.Argument(..., help="A dataset .h5 written by capsmed."),
         as_json: bool = json_option()) -> None:
    """Splits, class counts per split, groups, the leak check and every parameter."""
    from rich.console import Console

    if as_json:
        print_json(_dataset_record(file))
        return

    from capsmed.data.describe import describe_dataset

    console = Console()
    console.print(fit_to_width(describe_dataset(file), console.width))


def _dataset_record(file: Path) -> dict[str, Any]:
    """What ``data info`` shows, as ``--json`` prints it: every group (not the first
    dozen), counts by class name, and the file's own records whole."""
    from capsmed.data.contract import (
        DATA_REVISION,
        class_counts,
        find_leaks,
        fold_class_counts,
        fold_leaks,
        groups_by_split,
        read_info,
    )
    from capsmed.data.describe import every_image_own_group, leak_status

    info = read_info(file)
    groups = groups_by_split(file)
    counts = class_counts(file)
    leaks, spanning = find_leaks(groups), fold_leaks(file)
    names = info.class_names
    splits = {split: {"samples": int(row.sum()), "groups": len(groups[split]),
                      "class_counts": dict(zip(names, row.tolist(), strict=True))}
              for split, row in counts.items()}
    folds = {split: [dict(zip(names, row.tolist(), strict=True)) for row in per_fold]
             for split, per_fold in fold_class_counts(file).items()}
    return {"file": str(info.path), "dataset": info.dataset,
            "source": info.data_source().name, "domain": info.image_domain().name,
            "domain_recorded": info.domain is not None, "channels": info.channels,
            "image_size": list(info.image_size), "dtype": "uint8",
            "class_names": list(names), "created": info.created,
            "capsmed_version": info.capsmed_version, "format_version": info.format_version,
            # the table's data revision and leak-check lines (0: written before revisions)
            "data_revision": info.data_revision, "current_data_revision": DATA_REVISION,
            "splits": splits, "folds": folds,
            "groups": {split: sorted(members) for split, members in groups.items()},
            "leaks": leaks, "fold_leaks": spanning,
            "leak_check": leak_status(leaks, spanning, every_image_own_group(groups, counts)),
            "preprocessing": info.preprocessing,
            "source_record": info.source, "provenance": info.provenance}


@app.command("preview")
@handles_errors
def preview(
    file: Path = typer.Argument(..., help="A dataset .h5 written by capsmed."),
    output: Path = typer.Option(..., *OUTPUT_FLAGS, help="Image to write (.png; .pdf, "
                                ".svg, .jpg also work)."),
    split: str = typer.Option(None, help="Split to show [train, else the first split]."),
    per_class: int = typer.Option(None, help="Random samples per class [8]."),
    seed: int = typer.Option(None, help="Seed for choosing the samples [0]."),
) -> None:
    """A grid of random samples: one row per class (name, count), group/fold captions."""
    from capsmed.cli.common import only_set
    from capsmed.data.preview import preview_dataset

    # the library logs 'wrote PATH (size; split)': not said a second time here
    preview_dataset(file, output, **only_set(split=split, per_class=per_class, seed=seed))
