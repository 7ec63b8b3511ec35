"""Human-readable description of a dataset file: splits, classes, groups, parameters."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from rich.console import Group
from rich.markup import escape
from rich.table import Table

from capsmed.data.contract import (
    DATA_REVISION,
    class_counts,
    find_leaks,
    fold_class_counts,
    fold_leaks,
    groups_by_split,
    read_info,
)

MAX_LEAKS_SHOWN = 5


def _leak_check(leaks: dict[str, list[str]], spanning: dict[str, dict[str, list[int]]],
                has_folds: bool, per_image: bool = False) -> str:
    """The leak-check line: groups in two splits, and groups in two CV folds;
    ``per_image``: every image is its own group, so no check can fail."""
    found = [f"{g} in {'+'.join(s)}" for g, s in leaks.items()]
    found += [f"{g} in folds {'+'.join(map(str, k))} of '{split}'"
              for split, groups in spanning.items() for g, k in groups.items()]
    if not found and per_image:  # "ok" would vouch for patients it knows nothing of
        return ("[yellow]not checked: every image is its own group (no patient ids), "
                "so one patient's images may be in two splits")
    if not found:
        return "[green]ok: no group in two splits" + (" or two folds" if has_folds else "")
    more = (f" (and {len(found) - MAX_LEAKS_SHOWN} more)"
            if len(found) > MAX_LEAKS_SHOWN else "")
    return "[red]LEAK: " + escape(", ".join(found[:MAX_LEAKS_SHOWN]) + more)


def every_image_own_group(groups: dict[str, set[str]], counts: dict[str, np.ndarray]) -> bool:
    """Whether each image of the file is its own group (no patient ids: MedMNIST, MNIST,
    AML, a folder set without a group pattern), so that no leak check can fail."""
    return sum(map(len, groups.values())) == sum(int(row.sum()) for row in counts.values())


def leak_status(leaks: dict[str, list[str]], spanning: dict[str, dict[str, list[int]]],
                per_image: bool) -> str:
    """The leak check's verdict as ``data info --json`` gives it: ``leak``, ``not
    checked`` (every image its own group) or ``ok``, as the table's line says."""
    return "leak" if leaks or spanning else "not checked" if per_image else "ok"


def describe_dataset(path: Path, max_groups: int = 12) -> Group:
    """Rich tables for ``capsmed data info``; flags any group present in two splits or
    two CV folds. Every text read from the file is escaped: rich would take a name such
    as ``p[a]`` for markup and show ``p``."""
    info = read_info(path)
    counts = class_counts(path)
    groups = groups_by_split(path)
    leaks = find_leaks(groups)

    domain = info.image_domain()
    kind = (f"{info.data_source().name}, domain {domain.name}"
            + ("" if info.domain else " (not recorded: an older file)"))
    header = Table.grid(padding=(0, 2))
    for key, value in (("file", escape(str(info.path))), ("dataset", escape(info.dataset)),
                       ("source", escape(kind)),
                       ("images", f"{info.channels} x {info.image_size[0]} x "
                                  f"{info.image_size[1]} uint8"),
                       ("classes", escape(", ".join(info.class_names))),
                       ("created", escape(f"{info.created} by capsmed "
                                          f"{info.capsmed_version}")),
                       ("data revision", _revision(info.data_revision)),
                       ("group leak check", _leak_check(
                           leaks, fold_leaks(path), bool(info.folds),
                           per_image=every_image_own_group(groups, counts)))):
        header.add_row(f"[bold]{key}", value)

    splits = Table(title="Samples per split and class")
    splits.add_column("split")
    for name in info.class_names:
        splits.add_column(escape(name), justify="right")
    splits.add_column("total", justify="right")
    splits.add_column("groups", justify="right")
    for split, row in counts.items():
        splits.add_row(escape(split), *(f"{c:,}" for c in row), f"{row.sum():,}",
                       str(len(groups[split])))

    group_table = Table(title="Groups (cases / patients / slides) per split")
    group_table.add_column("split")
    group_table.add_column("groups")
    for split, members in groups.items():
        ordered = sorted(members)
        shown = ", ".join(ordered[:max_groups])
        if len(ordered) > max_groups:
            shown += f", ... (+{len(ordered) - max_groups})"
        group_table.add_row(escape(split), escape(shown))

    tables = [header, splits, group_table]
    for split, per_fold in fold_class_counts(path).items():
        fold_table = Table(title=escape(f"CV folds of '{split}'"))
        fold_table.add_column("fold", justify="right")
        for name in info.class_names:
            fold_table.add_column(escape(name), justify="right")
        for k, row in enumerate(per_fold):
            fold_table.add_row(str(k), *(f"{c:,}" for c in row))
        tables.append(fold_table)

    params = Table(title="Preprocessing parameters")
    params.add_column("parameter")
    params.add_column("value")
    for key, value in sorted(info.preprocessing.items()):
        # as recorded: a class folder named "été" or in CJK is not shown as \u escapes
        params.add_row(escape(key), escape(value if isinstance(value, str)
                                           else json.dumps(value, ensure_ascii=False)))
    # capsmed records {file: size}; another tool may record hashes, or a list of names
    files = info.source.get("files", {})
    files = files if isinstance(files, dict | list) else {}
    sizes = [v for v in (files.values() if isinstance(files, dict) else ())
             if isinstance(v, int) and not isinstance(v, bool)]
    total = (f", {sum(sizes):,} bytes" if isinstance(files, dict) and len(sizes) == len(files)
             else "")
    params.caption = escape(f"source: {info.source.get('raw_dir', '?')} "
                            f"({len(files)} files{total})")
    return Group(*tables, params)


def _revision(revision: int) -> str:
    """The file's data revision against this capsmed's (capsmed/data/schema.py)."""
    if revision == DATA_REVISION:
        return f"{revision} (this capsmed's)"
    written = str(revision) if revision else "none recorded (written before revisions)"
    return (f"{written}; this capsmed's is {DATA_REVISION}: its preprocessing makes "
            "other images or labels of some raw files (preprocess again for them)")
