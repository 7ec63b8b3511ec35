"""``report.html``: the whole evaluation in one self-contained file.

Images are embedded as base64 ``data:`` URIs and the CSS is inline, so the file can be
mailed, attached to a lab notebook or opened offline without the run directory.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capsmed.evaluate.agreement import AgreementResult
from capsmed.evaluate.metrics import ClassificationReport
from capsmed.evaluate.run_report import HEADERS, summary_rows, table_rows
from capsmed.io import write_text_atomic

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; line-height: 1.4; padding: 0 1em; }
h1 { font-size: 1.5em; border-bottom: 2px solid #2c5f8a; padding-bottom: .3em; }
h2 { font-size: 1.2em; color: #2c5f8a; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .8em 0; font-size: .92em; }
th, td { padding: .3em .8em; border-bottom: 1px solid #ddd; }
th { background: #eef3f8; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: bold; border-top: 2px solid #888; }
ul.notes li { color: #8a5a00; }
figure { margin: 1em 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #666; font-size: .9em; }
footer { margin-top: 3em; color: #999; font-size: .8em; }
"""


def data_uri(path: Path) -> str:
    """A PNG file as a ``data:image/png;base64,...`` URI."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _table(headers: Sequence[str] | None, rows: Sequence[Sequence[Any]],
           total_last: bool = False, numeric: bool = True) -> str:
    out = ["<table>"]
    if headers:
        out += ["<tr>", *(f"<th>{_esc(h)}</th>" for h in headers), "</tr>"]
    cell = '<td class="num">{}</td>' if numeric else "<td>{}</td>"
    for i, row in enumerate(rows):
        total = total_last and i == len(rows) - 1
        out.append('<tr class="total">' if total else "<tr>")
        out += [f"<th>{_esc(c)}</th>" if j == 0 and not headers else
                f"<td>{_esc(c)}</td>" if j == 0 else cell.format(_esc(c))
                for j, c in enumerate(row)]
        out.append("</tr>")
    return "".join(out) + "</table>"


def _figure(caption: str, path: Path) -> str:
    return (f'<figure><img src="{data_uri(path)}" alt="{_esc(caption)}">'
            f"<figcaption>{_esc(caption)}</figcaption></figure>")


def render_html(report: ClassificationReport, title: str, context: dict[str, Any],
                agreement: AgreementResult | None = None,
                figures: Sequence[tuple[str, str, Path]] = ()) -> str:
    """The report page as a string.

    Args:
        report: The metrics.
        title: Page heading.
        context: What was evaluated (run, data, split, checkpoint ...), shown as a table.
        agreement: Agr and the accuracy by orientation, when computed.
        figures: ``(section, caption, png path)``; figures of one section are grouped
            under its heading in the given order; missing files are left out.
    """
    parts = [f"<h1>{_esc(title)}</h1>",
             _table(None, list(context.items()), numeric=False),
             "<h2>Per-class metrics</h2>",
             _table(HEADERS, table_rows(report), total_last=True),
             "<p>Total (macro): the unweighted mean over classes where the value is "
             "defined. n/a: undefined (see the notes).</p>",
             "<h2>Summary</h2>", _table(("metric", "value"), summary_rows(report, agreement))]
    if agreement is not None:
        parts += ["<h2>Accuracy by orientation</h2>",
                  _table(("orientation", "accuracy"),
                         [(k, f"{v:.4f}") for k, v in agreement.accuracy.items()])]
    if report.notes:
        parts += ['<h2>Notes</h2><ul class="notes">']
        parts += [f"<li>{_esc(note)}</li>" for note in report.notes] + ["</ul>"]
    section = None
    for heading, caption, path in figures:
        if not Path(path).is_file():
            continue
        if heading != section:
            parts.append(f"<h2>{_esc(heading)}</h2>")
            section = heading
        parts.append(_figure(caption, path))
    parts.append("<footer>written by capsmed evaluate</footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_esc(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(parts) + "\n</body></html>\n")


def write_html(path: Path, report: ClassificationReport, title: str,
               context: dict[str, Any], agreement: AgreementResult | None = None,
               figures: Sequence[tuple[str, str, Path]] = ()) -> None:
    """Write :func:`render_html`'s page to ``path`` atomically."""
    write_text_atomic(Path(path), render_html(report, title, context, agreement, figures))
