"""``capsmed synth <dataset>``: synthetic data in the official on-disk layouts."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import handles_errors

app = typer.Typer(help="Write synthetic data in a dataset's official layout (for tests, "
                       "demos and trying the pipeline without the real download).",
                  no_args_is_help=True)


@app.command("tupac16")
@handles_errors
def tupac16(
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
