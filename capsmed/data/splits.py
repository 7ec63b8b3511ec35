"""Group-level (case / patient / slide) train/val/test splits: seeded, disjoint, recorded."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)


def split_groups(groups: Iterable[str], fractions: Mapping[str, float],
                 seed: int) -> dict[str, str]:
    """Assign each group to a split so that no group is in two splits.

    Groups are sorted, shuffled with ``seed`` and cut by largest-remainder rounding of
    ``fractions``; every split with a positive fraction gets at least one group when
    there are enough groups.

    Returns:
        ``{group: split}``.
    """
    unique = sorted(set(groups))
    names = [s for s, f in fractions.items() if f > 0]
    total = sum(fractions[s] for s in names)
    if not names or total <= 0:
        raise CapsmedError("split fractions must include at least one positive fraction")
    n = len(unique)
    exact = np.array([fractions[s] / total * n for s in names])
    counts = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - counts), kind="stable")[: n - counts.sum()]:
        counts[i] += 1
    if n >= len(names):  # give an empty split one group, taken from the largest
        for i in range(len(names)):
            if counts[i] == 0:
                counts[int(np.argmax(counts))] -= 1
                counts[i] += 1
    order = np.random.default_rng(seed).permutation(n)
    assignment: dict[str, str] = {}
    start = 0
    for name, count in zip(names, counts, strict=True):
        for idx in order[start:start + count]:
            assignment[unique[idx]] = name
        start += count
    return assignment


def read_split_files(files: Mapping[str, Path]) -> tuple[dict[str, str], dict[str, Path]]:
    """Read user split lists (``{split: path}``; one group id per line, ``#`` comments).

    Returns:
        ``{group: split}`` and ``{group: the file that lists it}``.

    Raises:
        CapsmedError: if a file is missing or a group is listed in two splits.
    """
    assignment: dict[str, str] = {}
    origin: dict[str, Path] = {}
    for split, path in files.items():
        path = Path(path)
        if not path.is_file():
            raise CapsmedError(f"{path}: split file not found")
        try:
            text = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise CapsmedError(f"{path}: cannot read split file ({exc})") from exc
        for line in text.splitlines():
            group = line.split("#", 1)[0].strip()
            if not group:
                continue
            if group in assignment and assignment[group] != split:
                raise CapsmedError(f"{path}: group '{group}' is also listed in "
                                   f"{origin[group]} ({assignment[group]}); splits must be "
                                   "disjoint")
            assignment[group] = split
            origin[group] = path
    return assignment, origin


def assign_splits(groups: Iterable[str], split_files: Mapping[str, str] | None,
                  fractions: Mapping[str, float], seed: int, unit: str = "group"
                  ) -> dict[str, str]:
    """``{group: split}`` from the user's split files when given, else seeded fractions.

    Groups named in a split file but absent from the data are an error (naming the
    file that lists them); groups in no split file are left out, with a warning.
    """
    present = sorted(set(groups))
    if not split_files:
        return split_groups(present, fractions, seed)
    assignment, origin = read_split_files({s: Path(p) for s, p in split_files.items()})
    unknown = sorted(set(assignment) - set(present))
    if unknown:
        path = origin[unknown[0]]
        named = [g for g in unknown if origin[g] == path]
        raise CapsmedError(f"{path}: lists {unit}(s) not in the data: {', '.join(named[:5])}"
                           + (f" (and {len(named) - 5} more)" if len(named) > 5 else ""))
    left_out = sorted(set(present) - set(assignment))
    if left_out:
        log.warning("%d %s(s) in no split file are left out: %s", len(left_out), unit,
                    ", ".join(left_out[:10]))
    return assignment


def warn_missing_classes(labels: Mapping[str, Iterable[int]], class_names: Sequence[str]
                         ) -> list[str]:
    """Warn, naming them, about splits that hold no sample of some class: a model cannot
    be validated or tested on a class its split lacks. Returns ``["val (b, c)", ...]``."""
    absent = []
    for split, values in labels.items():
        present = {int(v) for v in values}
        missing = [name for c, name in enumerate(class_names) if c not in present]
        if missing:
            absent.append(f"{split} ({', '.join(missing)})")
    if absent:
        log.warning("split(s) missing a class: %s", "; ".join(absent))
    return absent
