"""What ``capsmed predict`` reads: input files from files and folders, given centres."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capsmed.data.files import FolderWalk, check_file
from capsmed.data.slides import SLIDE_SUFFIXES
from capsmed.errors import CapsmedError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
CENTRE_COLUMNS = ("input", "x", "y")


@dataclass(frozen=True)
class InputFile:
    """One input: its path, the name outputs show and a file-name-safe stem."""

    path: Path
    name: str
    stem: str


def gather_inputs(given: list[Path], slides: bool) -> list[InputFile]:
    """Input files from files and folders (searched recursively, sorted).

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
            files = FolderWalk().files(item, suffixes)
            if not files:
                raise CapsmedError(f"{item}: no input files in this folder (looked for "
                                   f"{', '.join(suffixes)})")
            found += files
        elif item.is_file() or item.is_symlink():
            found.append(check_file(item, "input file"))
        else:
            raise CapsmedError(f"{item}: no such input file or folder")
    found = list(dict.fromkeys(found))
    stems: dict[str, int] = {}
    out = []
    for path in found:
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(path.with_suffix("").parts[-2:]))
        stems[stem] = stems.get(stem, 0) + 1
        out.append(InputFile(path, str(path), stem if stems[stem] == 1
                             else f"{stem}-{stems[stem]}"))
    return out


def read_centres(path: Path) -> dict[str, np.ndarray]:
    """``input,x,y`` rows (window centres, level-0 px) -> ``{input: int64 (K, 2)}``.

    ``input`` is matched against each input's path as given and its file name.
    """
    check_file(path, "centres CSV")
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
            header = [] if not rows else list(rows[0])
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CapsmedError(f"{path}: cannot read centres CSV ({exc})") from None
    missing = [c for c in CENTRE_COLUMNS if c not in header]
    if not rows or missing:
        raise CapsmedError(f"{path}: expected a header with columns input,x,y and one row "
                           "per window" + (f" (missing: {', '.join(missing)})" if rows else ""))
    by_input: dict[str, list[tuple[int, int]]] = {}
    for number, row in enumerate(rows, start=2):
        try:
            xy = (int(row["x"]), int(row["y"]))
        except (TypeError, ValueError):
            raise CapsmedError(f"{path}: line {number}: x and y must be integers (pixels), "
                               f"got {row['x']!r}, {row['y']!r}") from None
        by_input.setdefault(row["input"], []).append(xy)
    return {k: np.asarray(v, dtype=np.int64).reshape(-1, 2) for k, v in by_input.items()}


def centres_for(centres: dict[str, np.ndarray], item: InputFile) -> np.ndarray | None:
    """The given centres of ``item`` (by its path, else its file name), or None."""
    for key in (item.name, item.path.as_posix(), item.path.name):
        if key in centres:
            return centres[key]
    return None
