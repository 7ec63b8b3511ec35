"""Human-readable description of a dataset file: splits, classes, groups, parameters."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Group
from rich.table import Table

from capsmed.data.contract import (
    class_counts,
    find_leaks,
    fold_class_counts,
    groups_by_split,
    read_info,
)


def describe_dataset(path: Path, max_groups: int = 12) -> Group:
    """Rich tables for ``capsmed data info``; flags any group present in two splits."""
    info = read_info(path)
    counts = class_counts(path)
    groups = groups_by_split(path)
    leaks = find_leaks(groups)

    domain = info.image_domain()
    kind = (f"{info.data_source().name}, domain {domain.name}"
            + ("" if info.domain else " (not recorded: an older file)"))
    header = Table.grid(padding=(0, 2))
    for key, value in (("file", str(info.path)), ("dataset", info.dataset),
                       ("source", kind),
                       ("images", f"{info.channels} x {info.image_size[0]} x "
                                  f"{info.image_size[1]} uint8"),
                       ("classes", ", ".join(info.class_names)),
                       ("created", f"{info.created} by capsmed {info.capsmed_version}"),
                       ("group leak check", "[red]LEAK: " + ", ".join(
                           f"{g} in {'+'.join(s)}" for g, s in list(leaks.items())[:5])
                        if leaks else "[green]ok: no group in two splits")):
        header.add_row(f"[bold]{key}", value)

    splits = Table(title="Samples per split and class")
    splits.add_column("split")
    for name in info.class_names:
        splits.add_column(name, justify="right")
    splits.add_column("total", justify="right")
    splits.add_column("groups", justify="right")
    for split, row in counts.items():
        splits.add_row(split, *(f"{c:,}" for c in row), f"{row.sum():,}",
                       str(len(groups[split])))

    group_table = Table(title="Groups (cases / patients / slides) per split")
    group_table.add_column("split")
    group_table.add_column("groups")
    for split, members in groups.items():
        ordered = sorted(members)
        shown = ", ".join(ordered[:max_groups])
        if len(ordered) > max_groups:
            shown += f", ... (+{len(ordered) - max_groups})"
        group_table.add_row(split, shown)

    tables = [header, splits, group_table]
    for split, per_fold in fold_class_counts(path).items():
        fold_table = Table(title=f"CV folds of '{split}'")
        fold_table.add_column("fold", justify="right")
        for name in info.class_names:
            fold_table.add_column(name, justify="right")
        for k, row in enumerate(per_fold):
            fold_table.add_row(str(k), *(f"{c:,}" for c in row))
        tables.append(fold_table)

    params = Table(title="Preprocessing parameters")
    params.add_column("parameter")
    params.add_column("value")
    for key, value in sorted(info.preprocessing.items()):
        params.add_row(key, value if isinstance(value, str) else json.dumps(value))
    files = info.source.get("files", {})
    params.caption = (f"source: {info.source.get('raw_dir', '?')} "
                      f"({len(files)} files, {sum(files.values()):,} bytes)")
    return Group(*tables, params)
