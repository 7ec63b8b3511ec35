"""Report writers: JSON (everything), CSV (the table), Markdown, and a rich table.

Undefined values (None) are ``null`` in JSON, empty cells in CSV and ``n/a`` in the
tables; the report's notes say why each one is undefined.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from capsmed.evaluate.agreement import AgreementResult
from capsmed.evaluate.metrics import COLUMNS, RATIOS, ClassificationReport
from capsmed.io import write_text_atomic

HEADERS = ("class", "precision", "sensitivity", "specificity", "F1", "AUC", "support")


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for a table; ``n/a`` for an undefined value."""
    return "n/a" if value is None else f"{value:.{digits}f}"


def table_rows(report: ClassificationReport) -> list[list[str]]:
    """Rows of the per-class table with a final Total (macro) row, formatted."""
    rows = []
    for name, values in [*report.per_class.items(), ("Total (macro)", report.total)]:
        rows.append([name, *(fmt(values[k]) for k in RATIOS), str(values["support"])])
    return rows


def summary_rows(report: ClassificationReport,
                 agreement: AgreementResult | None = None) -> list[tuple[str, str]]:
    """(label, formatted value) of the overall metrics, in reading order."""
    rows = [("Accuracy (Acc)", fmt(report.accuracy, 4)),
            ("Balanced accuracy (WAcc: mean per-class sensitivity)",
             fmt(report.balanced_accuracy, 4)),
            ("Macro F1", fmt(report.macro_f1, 4)),
            ("Weighted F1 (by support)", fmt(report.weighted_f1, 4))]
    if report.auc_method is not None:
        rows.append((f"AUC ({report.auc_method})", fmt(report.auc, 4)))
    if agreement is not None:
        rows.append(("Agreement (Agr: same class in all 8 orientations)",
                     fmt(agreement.agreement, 4)))
    return rows


def rich_table(report: ClassificationReport, title: str,
               agreement: AgreementResult | None = None) -> Table:
    """The per-class table as a rich Table, with the overall metrics in the caption.

    Laid out for 80 columns (CI logs, pipes, ``| tee``), where rich's boxed table cut
    'sensitivity' and 'specificity' to 'sensitiv…': no vertical rules or outer
    padding, numeric columns never narrower than their header, and long class names
    wrapped rather than the headers cut. The metrics run over short caption lines.
    """
    first = [f"accuracy {fmt(report.accuracy)}",
             f"balanced accuracy {fmt(report.balanced_accuracy)}"]
    second = [f"macro F1 {fmt(report.macro_f1)}", f"weighted F1 {fmt(report.weighted_f1)}"]
    if report.auc_method is not None:
        first.append(f"AUC {fmt(report.auc)}")
    if agreement is not None:
        second.append(f"Agr {fmt(agreement.agreement)}")
    table = Table(title=title, caption="\n".join(" | ".join(line) for line in (first, second)),
                  box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    # the widest layout: 13 ("Total (macro)") + the headers + 2 per gap = 79 columns
    table.add_column(HEADERS[0], overflow="fold", min_width=len("Total (macro)"))
    for header in HEADERS[1:]:
        table.add_column(header, justify="right", no_wrap=True, min_width=len(header))
    rows = table_rows(report)
    for i, row in enumerate(rows):
        table.add_row(*row, style="bold" if i == len(rows) - 1 else None,
                      end_section=i == len(rows) - 2)
    return table


def markdown(report: ClassificationReport, title: str,
             agreement: AgreementResult | None = None) -> str:
    """The report as Markdown: table, overall metrics, agreement by orientation, notes."""
    lines = [f"# {title}", "", "| " + " | ".join(HEADERS) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(HEADERS) - 1)) + "|"]
    for row in table_rows(report):
        lines.append("| " + " | ".join(row) + " |")
    lines += [""] + [f"- {label}: {value}" for label, value in summary_rows(report, agreement)]
    if agreement is not None:
        lines += ["", "| orientation | accuracy |", "|---|---:|"]
        lines += [f"| {name} | {acc:.4f} |" for name, acc in agreement.accuracy.items()]
    lines += [""] + [f"- Note: {note}" for note in report.notes]
    return "\n".join(lines).rstrip("\n") + "\n"


def report_dict(report: ClassificationReport, context: dict[str, Any],
                agreement: AgreementResult | None = None) -> dict[str, Any]:
    """Everything report.json holds."""
    out = {**context, **report.to_dict()}
    if agreement is not None:
        out["agreement"] = agreement.to_dict()
    return out


def write_report(report: ClassificationReport, out_dir: Path, title: str,
                 context: dict[str, Any], agreement: AgreementResult | None = None) -> None:
    """Write ``report.json``, ``report.csv`` and ``report.md`` into ``out_dir``."""
    out_dir = Path(out_dir)
    # allow_nan=False: a NaN reaching the JSON is a bug to surface, not to write
    write_text_atomic(out_dir / "report.json",
                      json.dumps(report_dict(report, context, agreement), indent=2,
                                 allow_nan=False))
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(HEADERS)
    for name, values in [*report.per_class.items(), ("total", report.total)]:
        writer.writerow([name, *("" if values[k] is None else values[k] for k in COLUMNS)])
    write_text_atomic(out_dir / "report.csv", buf.getvalue())
    write_text_atomic(out_dir / "report.md", markdown(report, title, agreement))
