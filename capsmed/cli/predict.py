"""``capsmed predict RUN_DIR INPUT... -o OUT``: a trained run applied to new images."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set
from capsmed.cli.json_output import json_option, print_json_file
from capsmed.cli.options import OUTPUT_FLAGS, device_option, option
from capsmed.errors import CapsmedError
from capsmed.predict.config import Overrides, PredictOptions

EPILOG = ("Writes OUT/predictions.csv (one row per window: input, centre_x, centre_y, "
          "size, a score per class, predicted class), OUT/heatmaps/*.png, "
          "OUT/geojson/*.geojson (QuPath: File > Import objects) and OUT/summary.json.")


@handles_errors
def predict(
    run_dir: Path = typer.Argument(..., help="A run directory written by capsmed train."),
    inputs: list[Path] = typer.Argument(..., help="Image files, folders (searched "
                                        "recursively) or slides."),
    out: Path = typer.Option(..., *OUTPUT_FLAGS, help="New folder for the predictions."),
    class_name: str = typer.Option(None, "--class", help="Class of the heatmaps and "
                                   "GeoJSON positives [the second class: mitosis, lesion]."),
    threshold: float = option(PredictOptions, "threshold", "A window is positive (its predicted "
                              "class is --class) when its score of --class is at least this"),
    stride: int = typer.Option(None, help="Window step in source pixels [the recorded "
                               "stride, else half the patch; wsi: the tile]."),
    min_tissue: float = typer.Option(None, help="Least tissue (DIARETDB1: field-of-view) "
                                     "share of a window [as recorded]."),
    level: int = typer.Option(None, help="Slide pyramid level to read (tupac16 and wsi "
                              "runs; slides only) [as recorded]."),
    mpp: float = typer.Option(None, help="Microns per pixel to read slides at (tupac16 "
                              "and wsi runs; slides only) [as recorded]."),
    fov_mask: Path = typer.Option(None, help="DIARETDB1: field-of-view mask image "
                                  "[estimated per image]."),
    centres: Path = typer.Option(None, help="CSV of input,x,y window centres (pixels) to "
                                 "score instead of a grid."),
    shape: str = option(PredictOptions, "shape", "GeoJSON objects: tile (window squares) "
                        "or point (window centres)"),
    batch_size: int = option(PredictOptions, "batch_size", "Windows per forward pass"),
    device: str = device_option(),
    data: Path = typer.Option(None, help="The run's dataset .h5, for runs trained before "
                              "runs kept preprocessing.json."),
    heatmaps: bool = typer.Option(True, "--heatmaps/--no-heatmaps", help="Draw a heatmap "
                                  "PNG per input (about half a second each)."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Skip unreadable inputs "
                                    "(listed in summary.json; exit code 1) instead of "
                                    "stopping with nothing written."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace OUT if it exists."),
    as_json: bool = json_option(),
) -> None:
    """Apply a trained run to new images, folders or whole slides, replaying the exact
    preprocessing it was trained with (stain, CLAHE, patch size, resize)."""
    from capsmed.predict.engine import predict as run_predict
    from capsmed.predict.report import summary_table
    from capsmed.tables.terminal import print_tables

    options = PredictOptions(
        overrides=Overrides(stride=stride, min_tissue=min_tissue, level=level, mpp=mpp,
                            fov_mask=fov_mask),
        class_name=class_name, centres=centres, data=data, heatmaps=heatmaps,
        keep_going=keep_going,
        overwrite=overwrite, **only_set(threshold=threshold, shape=shape,
                                        batch_size=batch_size, device=device))
    result = run_predict(run_dir, inputs, out, options)
    if as_json:  # OUT/summary.json, as written
        print_json_file(result.out_dir / "summary.json")
    else:
        print_tables([summary_table(result)])
        echo_wrapped(f"predictions written to {result.out_dir}/")
    if result.failed:
        raise CapsmedError(f"{len(result.failed)} of {len(result.failed) + len(result.results)}"
                           f" input(s) failed (listed in {result.out_dir}/summary.json); "
                           "the others were predicted")
