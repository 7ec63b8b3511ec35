"""A run's report: the per-class table, the overall metrics and the accuracy by
orientation as :class:`capsmed.tables.Table` models, written as report.json (everything),
report.csv (the per-class table's raw numbers) and report.md, and shown in the terminal.

Undefined values (None) are ``null`` in JSON, empty cells in CSV and ``n/a`` in the
tables; the report's notes say why each one is undefined.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.text import Text

from capsmed.data.schema import refuse_total_row_name
from capsmed.evaluate.agreement import AgreementResult
from capsmed.evaluate.metrics import COLUMNS, RATIOS, ClassificationReport
from capsmed.io import write_text_atomic
from capsmed.tables import Column, Table, render, text_column
from capsmed.tables.terminal import to_rich

HEADERS = ("class", "precision", "sensitivity", "specificity", "F1", "AUC", "support")
SHORT = {"precision": "prec.", "sensitivity": "sens.", "specificity": "spec."}
TOTAL_NOTE = ("Total (macro): the unweighted mean over classes where the value is "
              "defined. n/a: undefined (see the notes).")


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for a table; ``n/a`` for an undefined value."""
    return "n/a" if value is None else f"{value:.{digits}f}"


def table_rows(report: ClassificationReport) -> list[list[str]]:
    """Rows of the per-class table with a final Total (macro) row, formatted."""
    rows = []
    for name, values in [*report.per_class.items(), ("Total (macro)", report.total)]:
        rows.append([name, *(fmt(values[k]) for k in RATIOS), str(values["support"])])
    return rows


def per_class_table(report: ClassificationReport, title: str = "Per-class metrics",
                    notes: bool = True) -> Table:
    """The per-class table; its CSV form holds the raw numbers and a ``total`` row."""
    csv_rows = [[name, *("" if values[k] is None else values[k] for k in COLUMNS)]
                for name, values in [*report.per_class.items(), ("total", report.total)]]
    return Table(title=title,
                 columns=[text_column(HEADERS[0]),
                          *(Column(h, short=SHORT.get(h, "")) for h in HEADERS[1:])],
                 rows=table_rows(report), total_rows=1,
                 notes=[TOTAL_NOTE, *report.notes] if notes else [],
                 csv_columns=list(HEADERS), csv_rows=csv_rows)


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


def summary_table(report: ClassificationReport,
                  agreement: AgreementResult | None = None) -> Table:
    return Table(title="Summary", columns=[text_column("metric"), Column("value")],
                 rows=[list(r) for r in summary_rows(report, agreement)])


def orientation_table(agreement: AgreementResult) -> Table:
    return Table(title="Accuracy by orientation",
                 columns=[text_column("orientation"), Column("accuracy")],
                 rows=[[k, f"{v:.4f}"] for k, v in agreement.accuracy.items()])


def report_tables(report: ClassificationReport,
                  agreement: AgreementResult | None = None) -> list[Table]:
    """What report.md and report.html show, in order."""
    tables = [per_class_table(report), summary_table(report, agreement)]
    return tables + ([orientation_table(agreement)] if agreement is not None else [])


def rich_table(report: ClassificationReport, title: str,
               agreement: AgreementResult | None = None,
               width: int | None = None) -> RenderableType:
    """The per-class table for the terminal (``width``: the console's), the overall
    metrics on two short lines under it. The notes are not repeated: evaluation logs
    them."""
    first = [f"accuracy {fmt(report.accuracy)}",
             f"balanced accuracy {fmt(report.balanced_accuracy)}"]
    second = [f"macro F1 {fmt(report.macro_f1)}", f"weighted F1 {fmt(report.weighted_f1)}"]
    if report.auc_method is not None:  # which AUC: the positive class's, or the macro
        binary = len(report.class_names) == 2
        which = f"AUC ({report.class_names[1]})" if binary else "macro AUC"
        first.append(f"{which} {fmt(report.auc)}")
    if agreement is not None:
        second.append(f"Agr {fmt(agreement.agreement)}")
    width = width or Console().width
    return Group(to_rich(per_class_table(report, title, notes=False), width),
                 *(Text(" | ".join(line)) for line in (first, second)))


def markdown(report: ClassificationReport, title: str,
             agreement: AgreementResult | None = None) -> str:
    """The report as Markdown: table, overall metrics, accuracy by orientation, notes."""
    return render("md", report_tables(report, agreement), title)


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
    refuse_total_row_name(report.class_names, out_dir)
    # allow_nan=False: a NaN reaching the JSON is a bug to surface, not to write
    write_text_atomic(out_dir / "report.json",
                      json.dumps(report_dict(report, context, agreement), indent=2,
                                 allow_nan=False))
    write_text_atomic(out_dir / "report.csv", render("csv", [per_class_table(report)]))
    write_text_atomic(out_dir / "report.md", markdown(report, title, agreement))


def tracked_metrics(report: ClassificationReport, prefix: str,
                    agreement: AgreementResult | None = None) -> dict[str, float]:
    """The report's numbers as an experiment tracker's metrics, grouped under ``prefix``
    (e.g. ``test/accuracy``, ``test/precision.NGS``): the overall ones, then each
    class's precision, sensitivity, specificity, F1 and AUC. Undefined values (None)
    are left out; the report's notes say why. (Not ``test/auc/NGS``: MLflow's file
    store keeps ``test/auc`` as a file, which cannot also be a folder.)"""
    values: dict[str, float | None] = {f"{prefix}/{k}": v for k, v in report.summary().items()}
    if agreement is not None:
        values[f"{prefix}/agreement"] = agreement.agreement
    for word, per_class in zip(_metric_words(report.class_names),
                               report.per_class.values(), strict=True):
        for k in RATIOS:
            values[f"{prefix}/{k}.{word}"] = per_class[k]
    return {k: float(v) for k, v in values.items() if v is not None}


def _metric_word(name: str) -> str:
    """A class name as the end of a metric name (trackers allow letters, digits and
    ``_-. ``; a slash would make it a path)."""
    word = re.sub(r"[^\w.\- ]", "_", name)
    return "_" if word in ("", ".", "..") else word


def _metric_words(names: tuple[str, ...]) -> list[str]:
    """:func:`_metric_word` of each class, made distinct: ``a:b`` and ``a?b`` both
    become ``a_b``, and one class's numbers would overwrite the other's; such a word
    gains the class's index (``a_b-0``, ``a_b-1``)."""
    words = [_metric_word(n) for n in names]
    out: list[str] = []
    for k, word in enumerate(words):
        if words.count(word) > 1:
            word = f"{word}-{k}"
        while word in out or (word in words and word != words[k]):
            word += "_"
        out.append(word)
    return out
