"""Whole-slide images: ``capsmed synth wsi`` and ``capsmed preprocess wsi``."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set, parse_split_files
from capsmed.cli.options import (
    OUTPUT,
    allow_group_leak_option,
    allow_no_annotations_option,
    domain_option,
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
from capsmed.data.sources.wsi.config import WsiConfig
from capsmed.errors import shell_quoted


@synth_app.command("wsi")
@handles_errors
def synth_wsi(
    out_dir: Path = typer.Argument(..., help="Folder to create (must not exist or be empty)."),
    slides: int = typer.Option(4, help="Number of slides; odd-numbered ones hold tumour."),
    size: int = typer.Option(2048, help="Level-0 side in pixels."),
    seed: int = synth_seed_option(),
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
    from capsmed.data.sources.wsi.synth import write_wsi

    paths = write_wsi(out_dir, slides=slides, size=size, seed=seed, levels=levels, tile=tile,
                      mpp=None if no_mpp else mpp, fmt=format,
                      points_per_slide=points_per_slide)
    echo_wrapped(f"annotations of the {len(paths)} slides: {out_dir}/annotations/*.geojson, "
                 "points.csv and slide_labels.csv")


@preprocess_app.command("wsi")
@handles_errors
def preprocess_wsi(
    slides: list[Path] = typer.Argument(..., help="Slide files (svs, ndpi, mrxs, tiff, "
                                        "png, ...) and/or folders of them."),
    output: Path = OUTPUT,
    overwrite: bool = overwrite_option(),
    level: int = option(WsiConfig, "level", "Pyramid level to tile at",
                        meaning="0, unless --mpp is given"),
    mpp: float = typer.Option(None, help="Microns per pixel to tile at (reads the nearest "
                              "finer level and resamples; needs mpp metadata).",
                              show_default=False),
    tile_size: int = option(WsiConfig, "tile_size", "Tile side at the chosen resolution"),
    stride: int = option(WsiConfig, "stride", "Grid step at the chosen resolution",
                         meaning="the tile size"),
    output_size: int = option(WsiConfig, "output_size", "Stored side after resizing",
                              meaning="the tile size"),
    min_tissue: float = option(WsiConfig, "min_tissue", "Min tissue fraction of a kept tile"),
    mask_downsample: float = option(WsiConfig, "mask_downsample", "Tissue-mask resolution: "
                                    "level 0 divided by this"),
    min_saturation: int = option(WsiConfig, "min_saturation", "Floor of the Otsu saturation "
                                 "threshold, 0-255"),
    labels_csv: Path = typer.Option(None, help="Point annotations: CSV slide,x,y,label "
                                    "(level-0 px).", show_default=False),
    geojson: list[Path] = typer.Option(None, help="QuPath GeoJSON polygons: one file per "
                                       "slide (<slide>.geojson) or a folder of them; "
                                       "repeatable.", show_default=False),
    slide_labels: Path = typer.Option(None, help="CSV slide,label: one label per slide.",
                                      show_default=False),
    min_overlap: float = option(WsiConfig, "min_overlap", "Polygons: least share of a tile "
                                "its class must cover", meaning="the class under the tile "
                                "centre"),
    unlabelled: str = option(WsiConfig, "unlabelled", "Tiles no point/polygon labels: "
                             "background or drop"),
    background_class: str = option(WsiConfig, "background_class", "Class of unlabelled "
                                   "tiles"),
    stain: str = option(WsiConfig, "stain", "none (RGB) or hematoxylin (1 channel)"),
    h_max: float = option(WsiConfig, "h_max", "Hematoxylin density mapped to black"),
    train: float = fraction_option(WsiConfig, "train", "slide"),
    val: float = fraction_option(WsiConfig, "val", "slide"),
    test: float = fraction_option(WsiConfig, "test", "slide"),
    split_file: list[str] = split_file_option("slide"),  # noqa: B008
    seed: int = seed_option(WsiConfig, "the slide split"),
    domain: str = domain_option(WsiConfig),
    workers: int = workers_option(WsiConfig),
    tiles_per_job: int = option(WsiConfig, "tiles_per_job", "Tiles per worker job"),
    allow_group_leak: bool = allow_group_leak_option(WsiConfig, "slide"),
    allow_no_annotations: bool = allow_no_annotations_option(WsiConfig,
                                                             "classified polygon"),
    stain_norm: str = stain_norm_option(WsiConfig),
    stain_target: str = stain_target_option(WsiConfig),
) -> None:
    """Whole-slide images: tissue mask, grid tiles at a level or mpp, labels, slide split."""
    from capsmed.data.sources.wsi.reader import preprocess_wsi as run

    fractions = split_fractions(WsiConfig, train, val, test)
    config = WsiConfig(**only_set(
        stain_norm=stain_norm,
        stain_target=stain_target,
        level=level, mpp=mpp, tile_size=tile_size, stride=stride, output_size=output_size,
        min_tissue=min_tissue, mask_downsample=mask_downsample, min_saturation=min_saturation,
        points_csv=None if labels_csv is None else str(labels_csv),
        geojson=tuple(str(g) for g in geojson) if geojson else None,
        slide_labels_csv=None if slide_labels is None else str(slide_labels),
        min_overlap=min_overlap, unlabelled=unlabelled, background_class=background_class,
        stain=stain, h_max=h_max, seed=seed, domain=domain, workers=workers,
        tiles_per_job=tiles_per_job,
        fractions=fractions,
        split_files=parse_split_files(split_file, fractions),
        allow_group_leak=allow_group_leak,
        allow_no_annotations=allow_no_annotations))
    path = run(slides, output, config, overwrite=overwrite)
    echo_wrapped(f"inspect it with: capsmed data info {shell_quoted(path)}")
