"""The terminal table ``capsmed predict`` prints (80 columns wide at most)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from capsmed.predict.engine import Prediction

SHOWN = 20  # inputs listed before "... and N more"


def summary_table(result: Prediction) -> Any:
    """Per input: windows, positives of the chosen class and the most frequent class."""
    from rich.table import Table

    # absolute first: commonpath refuses a mix of absolute and relative paths
    inputs = [Path(os.path.abspath(r.name)) for r in result.results]
    root = Path(os.path.commonpath([p.parent for p in inputs])) if inputs else Path()
    title = f"positives: {result.class_name} >= {result.threshold:g}"
    table = Table(title=title, title_justify="left", caption_justify="left",
                  caption=f"inputs under {root}/" if str(root) not in ("", ".") else None)
    table.add_column("input", overflow="fold", max_width=44)
    table.add_column("windows", justify="right")
    table.add_column("positives", justify="right")
    table.add_column("most predicted", overflow="fold", max_width=16)
    names = list(result.counts)
    for row, res in zip(result.per_input[:SHOWN], result.results, strict=False):
        counts = {}
        for k in res.predicted.tolist():
            counts[k] = counts.get(k, 0) + 1
        top = max(counts, key=counts.get) if counts else None
        shown = Path(os.path.abspath(row["input"])).relative_to(root).as_posix()
        table.add_row(shown, str(row["windows"]),
                      str(row.get("positives", "-")),
                      "-" if top is None else names[top])
    if len(result.results) > SHOWN:
        table.add_row(f"... and {len(result.results) - SHOWN} more", "", "", "")
    top = max(result.counts, key=result.counts.get) if result.results else "-"
    table.add_row("all inputs", str(sum(len(r.x) for r in result.results)),
                  str(result.positives), top, style="bold")
    return table
