"""HTML rendering of :class:`capsmed.tables.Table`: fragments for self-contained pages
(``report.html``) with the classes the page's CSS styles (``num``, ``total``, ``notes``)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from capsmed.tables import Table, register_renderer


def esc(value: Any) -> str:
    """Escaped text; a line break in a cell is kept."""
    return html.escape(str(value)).replace("\n", "<br>")


def _header_rows(t: Table) -> list[str]:
    out = []
    spans = t.spans()
    if any(label for label, _ in spans):
        out += ["<tr>", *(f'<th colspan="{n}">{esc(label)}</th>' for label, n in spans),
                "</tr>"]
    out += ["<tr>", *(f"<th>{esc(h)}</th>" for h in t.headers), "</tr>"]
    return out


def html_table(t: Table, heading_level: int = 2) -> str:
    """One table: its title as a heading, the ``<table>``, its notes as a list.

    The first column of a table without a header holds row labels (``<th>``).
    """
    out = [f"<h{heading_level}>{esc(t.title)}</h{heading_level}>"] if t.title else []
    out.append("<table>")
    if t.show_header:
        out += _header_rows(t)
    first_total = len(t.rows) - t.total_rows
    for k, row in enumerate(t.rows):
        out.append('<tr class="total">' if k >= first_total else "<tr>")
        for j, (cell, column) in enumerate(zip(row, t.columns, strict=True)):
            if j == 0 and not t.show_header:
                out.append(f"<th>{esc(cell)}</th>")
            elif column.align == "right":
                out.append(f'<td class="num">{esc(cell)}</td>')
            else:
                out.append(f"<td>{esc(cell)}</td>")
        out.append("</tr>")
    out.append("</table>")
    if t.notes:
        out += ['<ul class="notes">', *(f"<li>{esc(n)}</li>" for n in t.notes), "</ul>"]
    return "".join(out)


@register_renderer("html")
def html_fragment(tables: Sequence[Table], heading: str = "") -> str:
    """The tables as an HTML fragment under an ``<h1>`` heading (no page around it)."""
    out = [f"<h1>{esc(heading)}</h1>"] if heading else []
    return "\n".join(out + [html_table(t) for t in tables]) + "\n"
