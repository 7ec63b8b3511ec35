"""Any folder of class subfolders: ``capsmed synth folder`` and ``capsmed preprocess folder``."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import handles_errors, only_set, parse_split_files
from capsmed.cli.preprocess import app as preprocess_app
from capsmed.cli.synth import app as synth_app
from capsmed.errors import CapsmedError


@synth_app.command("folder")
@handles_errors
def synth_folder(
    out_dir: Path = typer.Argument(..., help="Folder to create (must not exist or be empty)."),
    classes: int = typer.Option(3, help="Number of classes (2-5): circle, square, triangle, "
                                "cross, ring."),
    images_per_class: int = typer.Option(12, help="PNG images per class."),
    patients: int = typer.Option(6, help="Patients (file prefixes P01_, P02_, ...)."),
    size: int = typer.Option(64, help="Image side in pixels."),
    seed: int = typer.Option(0, help="Random seed; same seed, same files."),
) -> None:
    """Shapes on noise as OUT_DIR/<class>/P<pp>_<nnnn>.png (a class-folder dataset)."""
    from capsmed.data.synth.folder import write_class_folders

    summary = write_class_folders(out_dir, classes=classes, images_per_class=images_per_class,
                                  patients=patients, size=size, seed=seed)
    typer.echo(f"wrote {summary.images} images ({', '.join(summary.classes)}; "
               f"{summary.patients} patients) to {summary.root}")


@preprocess_app.command("folder")
@handles_errors
def preprocess_folder(
    root: Path = typer.Argument(..., help="Folder of class subfolders: ROOT/<class>/<images> "
                                "(png, jpg, jpeg, tif, tiff, bmp; nested folders allowed)."),
    output: Path = typer.Option(..., "--output", "-o", help="The .h5 file to write."),
    classes: str = typer.Option(None, help="Comma-separated class folders to use, in label "
                                "order [every subfolder, sorted]."),
    channels: int = typer.Option(None, help="1 (grey) or 3 (RGB) [as the first image]."),
    size: int = typer.Option(None, help="Resize to SIZE x SIZE [keep the native size, which "
                             "must then be the same for every image]."),
    keep_aspect: bool = typer.Option(False, help="Fit the longer side to --size and pad the "
                                     "other centrally with black, instead of stretching."),
    scale16: str = typer.Option(None, help="16-bit to 8-bit: full (0..65535 -> 0..255) or "
                                "minmax (each image's own range) [full]."),
    group_pattern: str = typer.Option(None, help="Regex with one capture group searched in "
                                      "each file name, giving its patient, e.g. '^(P\\d+)_'."),
    groups_csv: Path = typer.Option(None, help="CSV of file,group rows (paths relative to "
                                    "ROOT)."),
    train: float = typer.Option(None, help="Fraction of groups for training [0.7]."),
    val: float = typer.Option(None, help="Fraction of groups for validation [0.15]."),
    test: float = typer.Option(None, help="Fraction of groups for testing [0.15]."),
    split_file: list[str] = typer.Option(None, help="SPLIT=FILE listing group ids, one per "
                                         "line; repeat per split. Overrides the fractions."),
    folds: int = typer.Option(None, help="Write one split 'all' with K stratified group "
                              "folds instead of train/val/test."),
    seed: int = typer.Option(None, help="Seed for the split or folds [0]."),
    name: str = typer.Option(None, help="Dataset name recorded in the file [ROOT's name]."),
    workers: int = typer.Option(None, help="Worker processes [one per CPU, up to 8]."),
    allow_group_leak: bool = typer.Option(False, help="Write even if a group is in two "
                                          "splits (not recommended)."),
) -> None:
    """Any class-folder dataset: 8-bit grey/RGB images, patient-level split or folds."""
    from capsmed.data.sources.folder import FolderConfig, preprocess_folder

    files = parse_split_files(split_file)
    given = only_set(train=train, val=val, test=test)
    if folds is not None and (files or given):
        raise CapsmedError("--folds writes one split 'all'; do not combine it with "
                           "--split-file or --train/--val/--test")
    fractions = {"train": 0.7, "val": 0.15, "test": 0.15, **given} if given else None
    if fractions and abs(sum(fractions.values()) - 1.0) > 1e-6:
        raise CapsmedError(f"--train/--val/--test sum to {sum(fractions.values()):g}, not 1 "
                           "(give all three, e.g. --val 0)")
    config = FolderConfig(**only_set(
        classes=tuple(c.strip() for c in classes.split(",") if c.strip()) if classes else None,
        channels=channels, size=size, scale16=scale16, group_pattern=group_pattern,
        groups_csv=str(groups_csv) if groups_csv else None, fractions=fractions,
        split_files=files, folds=folds, seed=seed,
        name=name, workers=workers), keep_aspect=keep_aspect,
        allow_group_leak=allow_group_leak)
    path = preprocess_folder(root, output, config)
    typer.echo(f"wrote {path}; inspect it with: capsmed data info {path} "
               f"(or: capsmed data preview {path} -o preview.png)")
