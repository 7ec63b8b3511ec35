"""The terminal table ``capsmed predict`` prints, through the one table model
(:mod:`capsmed.tables`): at 80 columns an input's name is shortened at its separators,
never split mid-word."""

from __future__ import annotations

import os
from pathlib import Path

from capsmed.predict.engine import Prediction
from capsmed.tables import Column, Table, text_column

SHOWN = 20  # inputs listed before "... and N more"


def _most_predicted(predicted: list[int], names: list[str]) -> str:
    counts: dict[int, int] = {}
    for k in predicted:
        counts[k] = counts.get(k, 0) + 1
    return names[max(counts, key=counts.__getitem__)] if counts else "-"


def summary_table(result: Prediction) -> Table:
    """Per input: windows, positives of the chosen class and the most frequent class;
    the inputs named below the folder they share (a note says which)."""
    # absolute first: commonpath refuses a mix of absolute and relative paths
    inputs = [Path(os.path.abspath(r.name)) for r in result.results]
    root = Path(os.path.commonpath([p.parent for p in inputs])) if inputs else Path()
    names = list(result.counts)
    rows = []
    for row, res in zip(result.per_input[:SHOWN], result.results, strict=False):
        shown = Path(os.path.abspath(row["input"])).relative_to(root).as_posix()
        rows.append([shown, str(row["windows"]), str(row.get("positives", "-")),
                     _most_predicted(res.predicted.tolist(), names)])
    if len(result.results) > SHOWN:
        rows.append([f"... and {len(result.results) - SHOWN} more", "", "", ""])
    # no window predicted at all (no tissue anywhere): no class is the most predicted
    top = (max(result.counts, key=result.counts.__getitem__)
           if any(result.counts.values()) else "-")
    rows.append(["all inputs", str(sum(len(r.x) for r in result.results)),
                 str(result.positives) if result.windowed else "-", top])
    title = (f"positives: {result.class_name} >= {result.threshold:g}" if result.windowed
             else "one prediction per image: its highest-scoring class")
    return Table(title=title,
                 columns=[text_column("input"), Column("windows"), Column("positives"),
                          text_column("most predicted", short="top class")],
                 rows=rows, total_rows=1,
                 notes=[f"inputs under {root}/"] if str(root) not in ("", ".") else [])
