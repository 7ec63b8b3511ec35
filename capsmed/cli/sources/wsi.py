"""Whole-slide images: ``capsmed synth wsi`` and ``capsmed preprocess wsi``."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import handles_errors, only_set, parse_split_files
from capsmed.cli.preprocess import app as preprocess_app
from capsmed.cli.synth import app as synth_app


@synth_app.command("wsi")
@handles_errors
def synth_wsi(
    out_dir: Path = typer.Argument(..., help="Folder to create (must not exist or be empty)."),
    slides: int = typer.Option(4, help="Number of slides; odd-numbered ones hold tumour."),
    size: int = typer.Option(2048, help="Level-0 side in pixels."),
    seed: int = typer.Option(0, help="Random seed; same seed, same files."),
    levels: int = typer.Option(3, help="Pyramid levels (each halves the previous)."),
    tile: int = typer.Option(256, help="TIFF tile side (multiple of 16)."),
    mpp: float = typer.Option(0.25, help="Level-0 microns per pixel (0.25 = 40x)."),
    no_mpp: bool = typer.Option(False, "--no-mpp", help="Write no microns-per-pixel "
                                "metadata (to try --level-only tiling)."),
    format: str = typer.Option("svs", "--format", help="svs (Aperio-style) or tiff "
                               "(generic tiled TIFF)."),
    points_per_slide: int = typer.Option(24, help="Point annotations per slide."),
) -> None:
    """Pyramidal H&E slides OpenSlide opens, with points, GeoJSON and slide labels."""
    from capsmed.data.synth.wsi import write_wsi

    paths = write_wsi(out_dir, slides=slides, size=size, seed=seed, levels=levels, tile=tile,
                      mpp=None if no_mpp else mpp, fmt=format,
                      points_per_slide=points_per_slide)
    typer.echo(f"wrote {len(paths)} slides to {out_dir}/slides with annotations/*.geojson, "
               "points.csv and slide_labels.csv")


@preprocess_app.command("wsi")
@handles_errors
def preprocess_wsi(
    slides: list[Path] = typer.Argument(..., help="Slide files (svs, ndpi, mrxs, tiff, "
                                        "png, ...) and/or folders of them."),
    output: Path = typer.Option(..., "--output", "-o", help="The .h5 file to write."),
    level: int = typer.Option(None, help="Pyramid level to tile at [0]."),
    mpp: float = typer.Option(None, help="Microns per pixel to tile at (reads the nearest "
                              "finer level and resamples; needs mpp metadata)."),
    tile_size: int = typer.Option(None, help="Tile side at the chosen resolution [256]."),
    stride: int = typer.Option(None, help="Grid step at the chosen resolution (default: "
                               "tile size)."),
    output_size: int = typer.Option(None, help="Stored side after resizing (default: tile "
                                    "size)."),
    min_tissue: float = typer.Option(None, help="Min tissue fraction of a kept tile [0.5]."),
    mask_downsample: float = typer.Option(None, help="Tissue-mask resolution: level 0 "
                                          "divided by this [16]."),
    min_saturation: int = typer.Option(None, help="Floor of the Otsu saturation threshold, "
                                       "0-255 [20]."),
    labels_csv: Path = typer.Option(None, help="Point annotations: CSV slide,x,y,label "
                                    "(level-0 px)."),
    geojson: list[Path] = typer.Option(None, help="QuPath GeoJSON polygons: one file per "
                                       "slide (<slide>.geojson) or a folder of them; "
                                       "repeatable."),
    slide_labels: Path = typer.Option(None, help="CSV slide,label: one label per slide."),
    min_overlap: float = typer.Option(None, help="Polygons: least share of a tile its class "
                                      "must cover (default: the class under the tile centre)."),
    unlabelled: str = typer.Option(None, help="Tiles no point/polygon labels: background "
                                   "or drop (default: background)."),
    background_class: str = typer.Option(None, help="Class of unlabelled tiles "
                                         "(default: background)."),
    stain: str = typer.Option(None, help="none (RGB) or hematoxylin (1 channel) (default: none)."),
    h_max: float = typer.Option(None, help="Hematoxylin density mapped to black [0.2]."),
    train: float = typer.Option(0.7, help="Fraction of slides for training."),
    val: float = typer.Option(0.15, help="Fraction of slides for validation."),
    test: float = typer.Option(0.15, help="Fraction of slides for testing."),
    split_file: list[str] = typer.Option(None, help="SPLIT=FILE listing slide ids, one per "
                                         "line; repeat for train, val, test. Overrides the "
                                         "fractions."),
    seed: int = typer.Option(None, help="Seed of the slide split [0]."),
    workers: int = typer.Option(None, help="Worker processes (default: one per CPU, up to 8)."),
    tiles_per_job: int = typer.Option(None, help="Tiles per worker job [256]."),
    allow_group_leak: bool = typer.Option(False, help="Write even if a slide is in two "
                                          "splits (not recommended)."),
) -> None:
    """Whole-slide images: tissue mask, grid tiles at a level or mpp, labels, slide split."""
    from capsmed.data.sources.wsi import WsiConfig
    from capsmed.data.sources.wsi import preprocess_wsi as run

    files = parse_split_files(split_file)
    config = WsiConfig(**only_set(
        level=level, mpp=mpp, tile_size=tile_size, stride=stride, output_size=output_size,
        min_tissue=min_tissue, mask_downsample=mask_downsample, min_saturation=min_saturation,
        points_csv=None if labels_csv is None else str(labels_csv),
        geojson=tuple(str(g) for g in geojson) if geojson else None,
        slide_labels_csv=None if slide_labels is None else str(slide_labels),
        min_overlap=min_overlap, unlabelled=unlabelled, background_class=background_class,
        stain=stain, h_max=h_max, seed=seed, workers=workers, tiles_per_job=tiles_per_job,
        split_files=files),
        fractions={"train": train, "val": val, "test": test},
        allow_group_leak=allow_group_leak)
    path = run(slides, output, config)
    typer.echo(f"wrote {path}; inspect it with: capsmed data info {path}")
