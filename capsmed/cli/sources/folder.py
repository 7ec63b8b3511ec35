"""Any folder of class subfolders: ``capsmed synth folder`` and ``capsmed preprocess folder``."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set, parse_split_files
from capsmed.cli.options import (
    OUTPUT,
    allow_group_leak_option,
    domain_option,
    flag,
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
from capsmed.data.sources.folder.config import FolderConfig
from capsmed.errors import CapsmedError, shell_quoted


@synth_app.command("folder")
@handles_errors
def synth_folder(
    out_dir: Path = typer.Argument(..., help="Folder to create (must not exist or be empty)."),
    classes: int = typer.Option(3, help="Number of classes (2-5): circle, square, triangle, "
                                "cross, ring."),
    images_per_class: int = typer.Option(12, help="PNG images per class."),
    patients: int = typer.Option(6, help="Patients (file prefixes P01_, P02_, ...)."),
    size: int = typer.Option(64, help="Image side in pixels."),
    seed: int = synth_seed_option(),
) -> None:
    """Shapes on noise as OUT_DIR/<class>/P<pp>_<nnnn>.png (a class-folder dataset)."""
    from capsmed.data.sources.folder.synth import write_class_folders

    write_class_folders(out_dir, classes=classes, images_per_class=images_per_class,
                        patients=patients, size=size, seed=seed)


@preprocess_app.command("folder")
@handles_errors
def preprocess_folder(
    root: Path = typer.Argument(..., help="Folder of class subfolders: ROOT/<class>/<images> "
                                "(png, jpg, jpeg, tif, tiff, bmp; nested folders allowed)."),
    output: Path = OUTPUT,
    overwrite: bool = overwrite_option(),
    classes: str = option(FolderConfig, "classes", "Comma-separated class folders to use, in "
                          "label order", meaning="every subfolder, sorted"),
    channels: int = option(FolderConfig, "channels", "1 (grey) or 3 (RGB)",
                           meaning="as the first image"),
    size: int = option(FolderConfig, "size", "Resize to SIZE x SIZE", meaning="keep the "
                       "native size, which must then be the same for every image"),
    keep_aspect: bool = flag(FolderConfig, "keep_aspect", "Fit the longer side to --size and "
                             "pad the other centrally with black, instead of stretching"),
    scale16: str = option(FolderConfig, "scale16", "16-bit to 8-bit: full (0..65535 -> "
                          "0..255) or minmax (each image's own range)"),
    group_pattern: str = typer.Option(None, help="Regex with one capture group searched in "
                                      "each file name, giving its patient, e.g. '^(P\\d+)_'.",
                                      show_default=False),
    groups_csv: Path = typer.Option(None, help="CSV of file,group rows (paths relative to "
                                    "ROOT).", show_default=False),
    train: float = fraction_option(FolderConfig, "train", "group"),
    val: float = fraction_option(FolderConfig, "val", "group"),
    test: float = fraction_option(FolderConfig, "test", "group"),
    split_file: list[str] = split_file_option("group"),  # noqa: B008
    folds: int = typer.Option(None, help="Write one split 'all' with K stratified group "
                              "folds instead of train/val/test.", show_default=False),
    seed: int = seed_option(FolderConfig, "the split or folds"),
    name: str = option(FolderConfig, "name", "Dataset name recorded in the file",
                       meaning="ROOT's name"),
    domain: str = domain_option(FolderConfig),
    workers: int = workers_option(FolderConfig),
    allow_group_leak: bool = allow_group_leak_option(FolderConfig, "group"),
    stain_norm: str = stain_norm_option(FolderConfig),
    stain_target: str = stain_target_option(FolderConfig),
) -> None:
    """Any class-folder dataset: 8-bit grey/RGB images, patient-level split or folds."""
    from capsmed.data.sources.folder.reader import preprocess_folder

    fractions = split_fractions(FolderConfig, train, val, test)
    files = parse_split_files(split_file, fractions)
    if folds is not None and (files or fractions):
        raise CapsmedError("--folds writes one split 'all'; do not combine it with "
                           "--split-file or --train/--val/--test")
    config = FolderConfig(**only_set(
        stain_norm=stain_norm,
        stain_target=stain_target,
        classes=(tuple(c.strip() for c in classes.split(",") if c.strip())
                 if classes is not None else None),  # "" names none: refused, not all
        channels=channels, size=size, keep_aspect=keep_aspect, scale16=scale16,
        group_pattern=group_pattern, groups_csv=str(groups_csv) if groups_csv else None,
        fractions=fractions, split_files=files, folds=folds, seed=seed, name=name,
        domain=domain, workers=workers, allow_group_leak=allow_group_leak))
    path = preprocess_folder(root, output, config, overwrite=overwrite)
    echo_wrapped(f"inspect it with: capsmed data info {shell_quoted(path)} (or: capsmed data "
                 f"preview {shell_quoted(path)} -o preview.png)")
