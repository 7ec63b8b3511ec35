"""Report writers: JSON (everything), CSV (the table), Markdown, and a rich table."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from capsmed.evaluate.metrics import COLUMNS, ClassificationReport
from capsmed.io import write_text_atomic

HEADERS = ("class", "precision", "sensitivity", "specificity", "F1", "support")


def table_rows(report: ClassificationReport) -> list[list[str]]:
    """Rows of the per-class table with a final Total (macro) row, formatted."""
    rows = []
    for name, values in [*report.per_class.items(), ("Total (macro)", report.total)]:
        rows.append([name, *(f"{values[k]:.3f}" for k in COLUMNS if k != "support"),
                     str(values["support"])])
    return rows


def rich_table(report: ClassificationReport, title: str) -> Table:
    """The per-class table as a rich Table, with Acc and balanced Acc in the caption."""
    table = Table(title=title, caption=f"accuracy {report.accuracy:.3f} | "
                                       f"balanced accuracy {report.balanced_accuracy:.3f}")
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i == 0 else "right")
    rows = table_rows(report)
    for i, row in enumerate(rows):
        table.add_row(*row, style="bold" if i == len(rows) - 1 else None,
                      end_section=i == len(rows) - 2)
    return table


def markdown(report: ClassificationReport, title: str) -> str:
    lines = [f"# {title}", "", "| " + " | ".join(HEADERS) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(HEADERS) - 1)) + "|"]
    for row in table_rows(report):
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"- Accuracy: {report.accuracy:.4f}",
              f"- Balanced accuracy (mean per-class sensitivity): "
              f"{report.balanced_accuracy:.4f}"]
    lines += [f"- Note: {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def write_report(report: ClassificationReport, out_dir: Path, title: str,
                 context: dict[str, Any]) -> None:
    """Write ``report.json``, ``report.csv`` and ``report.md`` into ``out_dir``."""
    out_dir = Path(out_dir)
    write_text_atomic(out_dir / "report.json",
                      json.dumps({**context, **report.to_dict()}, indent=2))
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(HEADERS)
    for name, values in [*report.per_class.items(), ("total", report.total)]:
        writer.writerow([name, *(values[k] for k in COLUMNS)])
    write_text_atomic(out_dir / "report.csv", buf.getvalue())
    write_text_atomic(out_dir / "report.md", markdown(report, title))
