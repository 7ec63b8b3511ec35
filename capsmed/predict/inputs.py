"""What ``capsmed predict`` reads: input files from files and folders, given centres."""

from __future__ import annotations

import contextlib
import csv
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capsmed.data.files import FolderWalk, check_file
from capsmed.data.slides import SLIDE_SUFFIXES
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
# --centres columns: the window centre as x, y, or as predictions.csv names it
CENTRE_COLUMNS = (("input", "x", "y"), ("input", "centre_x", "centre_y"))


@dataclass(frozen=True)
class InputFile:
    """One input: its path, the name outputs show and a file-name-safe stem."""

    path: Path
    name: str
    stem: str


def gather_inputs(given: list[Path], slides: bool) -> list[InputFile]:
    """Input files from files and folders (searched recursively, sorted).

    A file reached twice (two folders, a link, ``a/../a/01.tif``) is predicted once,
    under the first path it was reached by; how many were dropped is logged.

    Args:
        given: Files and folders, in the user's order.
        slides: Whether whole-slide formats count as inputs in folders.
    """
    if not given:
        raise CapsmedError("no input given: name image files, folders or slides")
    suffixes = tuple(dict.fromkeys(IMAGE_SUFFIXES + (SLIDE_SUFFIXES if slides else ())))
    found: list[Path] = []
    for item in map(Path, given):
        if item.is_dir():
            others: list[Path] = []
            files = FolderWalk().files(item, suffixes, others=others)
            _refuse_run_folders(item, files)
            if not files:
                raise CapsmedError(f"{item}: no input files in this folder (looked for "
                                   f"{', '.join(suffixes)})")
            _refuse_unread_images(item, others, suffixes)
            found += files
        elif item.is_file() or item.is_symlink():
            found.append(check_file(item, "input file"))
        else:
            raise CapsmedError(f"{item}: no such input file or folder")
    first: dict[str, Path] = {}  # real path -> the first path it was reached by
    for path in found:
        first.setdefault(os.path.realpath(path), path)
    if len(first) < len(found):
        log.warning("%d input(s) name a file already given (the same file through another "
                    "folder, a link or another spelling); each file is predicted once",
                    len(found) - len(first))
    stems = [re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(path.with_suffix("").parts[-2:]))
             for path in first.values()]
    own = {stem.casefold() for stem in stems}  # a suffix never takes another's own name
    taken: set[str] = set()
    out = []
    for path, stem in zip(first.values(), stems, strict=True):
        unique, n = stem, 1
        while unique.casefold() in taken or (n > 1 and unique.casefold() in own):
            n += 1  # casefold: one file on a case-blind disk
            unique = f"{stem}-{n}"
        taken.add(unique.casefold())
        out.append(InputFile(path, str(path), unique))
    return out


def _is_run_folder(folder: Path) -> bool:
    return (folder / "config.yaml").is_file() and (folder / "checkpoint.json").is_file()


def _refuse_run_folders(item: Path, files: list[Path]) -> None:
    """Refuse an input folder that is, holds or lies in a training run folder (``RUN``,
    a folder of runs, ``RUN/report``): its curves and report figures would be predicted
    as images, exit 0."""
    folders = {item, *item.parents[:2]}  # RUN/report, RUN/analysis/NAME
    for parent in {path.parent for path in files}:  # a few folders for many files
        with contextlib.suppress(ValueError):  # a file reached by a link out of item
            parts = parent.relative_to(item).parts
            folders.update(item.joinpath(*parts[:k]) for k in range(1, len(parts) + 1))
    for folder in sorted(folders, key=lambda p: len(p.parts)):
        if _is_run_folder(folder):
            where = ("is a training run folder" if folder == item else
                     f"{'holds' if item in folder.parents else 'lies in'} a training run "
                     f"folder ({folder})")
            raise CapsmedError(f"{item}: {where}, not a folder of images (the run to apply "
                               "comes first: capsmed predict RUN_DIR INPUT... -o OUT)")


def _refuse_unread_images(folder: Path, others: list[Path], suffixes: tuple[str, ...]
                          ) -> None:
    """Refuse image files in an input folder that predict does not look for (WebP,
    GIF, DICOM, a slide for a run that reads none, ...): they would be left out
    without a word, their rows missing from predictions.csv."""
    from capsmed.data.images import UNREAD_IMAGE_EXTENSIONS

    unread = [p for p in others if p.suffix.lower() in UNREAD_IMAGE_EXTENSIONS]
    if unread:
        raise CapsmedError(f"{unread[0]}: a {unread[0].suffix[1:].upper()} file, a format "
                           f"this run does not read from folders ({len(unread)} such "
                           f"file(s) under {folder}); it would be left out: convert such "
                           f"files to {', '.join(s[1:] for s in suffixes)} or move them "
                           "out")


def read_centres(path: Path) -> dict[str, np.ndarray]:
    """``input,x,y`` rows (window centres, level-0 px; or ``centre_x,centre_y``, so a
    predictions.csv can be given back) -> ``{input: int64 (K, 2)}``; a row repeating
    an earlier one is refused. :func:`match_centres` matches ``input`` to the inputs."""
    check_file(path, "centres CSV")
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
            header = [] if not rows else list(rows[0])
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CapsmedError(f"{path}: cannot read centres CSV ({exc})") from None
    names = next((c for c in CENTRE_COLUMNS if set(c) <= set(header)), None)
    if not rows or names is None:
        missing = [c for c in CENTRE_COLUMNS[0] if c not in header]
        raise CapsmedError(f"{path}: expected a header with columns input,x,y (or "
                           "input,centre_x,centre_y) and one row per window"
                           + (f" (missing: {', '.join(missing)})" if rows else ""))
    _, cx, cy = names
    by_input: dict[str, list[tuple[int, int]]] = {}
    lines: dict[tuple[str, int, int], int] = {}
    for number, row in enumerate(rows, start=2):
        try:
            xy = (int(row[cx]), int(row[cy]))
        except (TypeError, ValueError):
            raise CapsmedError(f"{path}: line {number}: {cx} and {cy} must be integers "
                               f"(pixels), got {row[cx]!r}, {row[cy]!r}") from None
        if (row["input"], *xy) in lines:
            raise CapsmedError(f"{path}: line {number}: the same window as line "
                               f"{lines[row['input'], *xy]} ({row['input']}, x={xy[0]}, "
                               f"y={xy[1]}); it would be scored twice")
        lines[row["input"], *xy] = number
        by_input.setdefault(row["input"], []).append(xy)
    return {k: np.asarray(v, dtype=np.int64).reshape(-1, 2) for k, v in by_input.items()}


def match_centres(centres: dict[str, np.ndarray], items: list[InputFile],
                  source: Path) -> dict[str, np.ndarray]:
    """The given centres of every input, as ``{item.name: centres}``.

    A CSV ``input`` names an input by its path (as given, or the same file by another
    spelling) or, failing that, by its file name, which must then be unique among the
    inputs. Refused: a name matching no input or several, an input named by two
    different names, and an input the CSV does not name (it would be scored on a grid
    mixed in with the given windows).
    """
    real = {i.name: os.path.realpath(i.path) for i in items}
    owner: dict[str, str] = {}  # item.name -> the CSV name that gave its centres
    for key in centres:
        hits = [i for i in items if key in (i.name, i.path.as_posix())
                or os.path.realpath(key) == real[i.name]]
        hits = hits or [i for i in items if i.path.name == key]
        if not hits:
            raise CapsmedError(f"{source}: names input(s) not given: {key}")
        if len(hits) > 1:
            shown = ", ".join(i.name for i in hits[:3]) + (", ..." if len(hits) > 3 else "")
            raise CapsmedError(f"{source}: '{key}' is ambiguous: it names {len(hits)} "
                               f"inputs ({shown}); write the path as given instead")
        name = hits[0].name
        if name in owner:
            raise CapsmedError(f"{source}: '{owner[name]}' and '{key}' both name {name}; "
                               "use one name per input")
        owner[name] = key
    unnamed = [i.name for i in items if i.name not in owner]
    if unnamed:
        raise CapsmedError(f"{source}: names no centres for input {unnamed[0]}"
                           + (f" (and {len(unnamed) - 1} more)" if len(unnamed) > 1 else "")
                           + "; with --centres every input needs its windows")
    return {name: centres[key] for name, key in owner.items()}


def check_out_dir(out_dir: Path, given: list[Path], items: list[InputFile],
                  protected: list[Path], overwrite: bool) -> None:
    """Refuse an output folder that would read or delete what predict reads.

    Refused, before anything is written: an output that is an input folder or lies
    inside one (a later run would take the outputs for inputs), one that contains an
    input or a ``protected`` path (the run folder, the centres CSV, ...), which
    ``--overwrite`` would delete, and, with ``--overwrite``, an existing folder inside
    the run folder that is not an earlier prediction (a folder of the run).

    Args:
        out_dir: The output folder asked for.
        given: The inputs as given (files and folders).
        items: The input files found.
        protected: Other paths predict reads; ``protected[0]`` is the run folder.
    """
    out = Path(os.path.realpath(out_dir))
    for folder in (p for p in map(Path, given) if p.is_dir()):
        if out.is_relative_to(os.path.realpath(folder)):
            raise CapsmedError(f"{out_dir}: the output folder is (or lies inside) the input "
                               f"folder {folder}, whose files predict reads; choose a "
                               "folder outside the inputs")
    for path in [*(i.path for i in items), *protected]:
        if Path(os.path.realpath(path)).is_relative_to(out):
            raise CapsmedError(f"{out_dir}: the output folder contains {path}, which "
                               "predict reads (--overwrite would delete it); choose "
                               "another folder")
    run = Path(os.path.realpath(protected[0]))
    earlier = (out / "summary.json").is_file() and (out / "predictions.csv").is_file()
    if overwrite and out.is_relative_to(run) and out.exists() and not earlier:
        raise CapsmedError(f"{out_dir}: a folder of the run {protected[0]} and not an "
                           "earlier prediction; --overwrite would delete it")
