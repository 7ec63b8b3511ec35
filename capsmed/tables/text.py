"""Markdown, CSV and LaTeX (booktabs) renderings of :class:`capsmed.tables.Table`."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence

from capsmed.tables import PLUS_MINUS, Table, register_renderer

# What Markdown (GitHub, MkDocs) would read as markup in a name and hide: an HTML tag or
# entity (a class named <b>), emphasis and code spans (*grade*, `x`, _x_ at a word's
# edge; tumor_grade_2 stays as it is) and a backslash escape. "<=" or "< 0.05" open no
# tag and stay readable.
_MD_MARKUP = re.compile(r"\\(?=[!-/:-@\[-`{-~])|[*`]|(?<![^\W_])_|_(?![^\W_])"
                        r"|<(?=[A-Za-z/!?])|&(?=#?[A-Za-z0-9]+;)")
_MD_ENTITY = {"<": "&lt;", "&": "&amp;"}


def md_escape(text: str) -> str:
    """``text`` as Markdown shows it literally, one line (a line break is ``<br>``)."""
    text = _MD_MARKUP.sub(lambda m: _MD_ENTITY.get(m[0], "\\" + m[0]), text)
    return text.replace("\n", "<br>")


def _md_cell(text: str) -> str:
    return md_escape(text).replace("|", "\\|")


def markdown_lines(t: Table, level: int = 2) -> list[str]:
    """One table as Markdown lines: heading, pipe table (totals bold), notes as a list;
    a table without columns is its heading and its notes as paragraphs."""
    out = [f"{'#' * level} {md_escape(t.title)}", ""] if t.title else []
    if not t.columns:
        return out + [line for note in t.notes for line in (_md_cell(note), "")]
    align = [":---" if c.align == "left" else "---:" for c in t.columns]
    if t.show_header:
        out += ["| " + " | ".join(map(_md_cell, t.header_labels())) + " |",
                "|" + "|".join(align) + "|"]
    else:  # a pipe table needs a header row: an empty one
        out += ["|" + "|".join(" " for _ in t.columns) + "|", "|" + "|".join(align) + "|"]
    for k, row in enumerate(t.rows):
        bold = k >= len(t.rows) - t.total_rows
        cells = [f"**{c}**" if bold and c else c for c in map(_md_cell, row)]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    if t.notes:
        out += [f"- {_md_cell(note)}" for note in t.notes] + [""]
    return out


@register_renderer("md")
def markdown(tables: Sequence[Table], heading: str = "") -> str:
    """Markdown: a ``#`` heading, then each table under its ``##`` title."""
    out = [f"# {md_escape(heading)}", ""] if heading else []
    for t in tables:
        out += markdown_lines(t)
    return "\n".join(out).rstrip("\n") + "\n"


@register_renderer("csv")
def csv_text(tables: Sequence[Table], heading: str = "") -> str:
    """CSV of the raw numbers; several tables must share their CSV header (``heading``
    is not written: a CSV has one header row)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    header: list[str] | None = None
    for t in tables:
        columns, rows = t.csv_table()
        if header is None:
            header = columns
            writer.writerow(header)
        elif columns != header:
            raise ValueError("tables written to one CSV need the same columns")
        writer.writerows([["" if v is None else v for v in row] for row in rows])
    return buf.getvalue()


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$",
                  "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                  "^": r"\textasciicircum{}", PLUS_MINUS: r"$\pm$", "<": r"$<$",
                  ">": r"$>$", "≥": r"$\geq$", "–": "--", "−": "$-$", "…": r"\ldots{}",
                  "†": r"\dag{}", "|": r"\textbar{}"}


def latex_escape(text: str) -> str:
    """Escape LaTeX's special characters; ``±`` becomes ``$\\pm$``.

    ``|`` is ``\\textbar{}``: in the default font encoding a bare ``|`` prints a dash.
    Two hyphens stay two (``--resume``, ``a--b``): LaTeX would join them into a dash."""
    text = text.replace("->", "\x00").replace("\n", " ")
    text = re.sub(r"-(?=-)", "-\x01", text)
    escaped = "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)
    return escaped.replace("\x00", r"$\rightarrow$").replace("\x01", "{}")


def _latex_spans(t: Table) -> list[str]:
    """The spanned header row with a ``\\cmidrule`` under each span."""
    spans = t.spans()
    if not any(label for label, _ in spans):
        return []
    cells, rules, col = [], [], 1
    for label, n in spans:
        if label:
            cells.append(f"\\multicolumn{{{n}}}{{c}}{{{latex_escape(label)}}}")
            rules.append(f"\\cmidrule(lr){{{col}-{col + n - 1}}}")
        else:
            cells += [""] * n
        col += n
    return [" & ".join(cells) + " \\\\", " ".join(rules)]


def latex_table(t: Table) -> list[str]:
    """One ``table`` environment with booktabs rules."""
    out = ["\\begin{table}[ht]", "\\centering", "\\small",
           f"\\caption{{{latex_escape(t.title)}}}"]
    if t.label:
        out.append(f"\\label{{tab:{t.label}}}")
    align = "".join("l" if c.align == "left" else "r" for c in t.columns)
    out += [f"\\begin{{tabular}}{{{align}}}", "\\toprule", *_latex_spans(t)]
    if t.show_header:
        out += [" & ".join(latex_escape(c) for c in t.headers) + " \\\\", "\\midrule"]
    for k, row in enumerate(t.rows):
        if t.total_rows and k == len(t.rows) - t.total_rows:
            out.append("\\midrule")
        out.append(" & ".join(latex_escape(c) for c in row) + " \\\\")
    out += ["\\bottomrule", "\\end{tabular}"]
    if t.notes:
        out += ["", "\\smallskip", "\\begin{minipage}{0.95\\linewidth}\\footnotesize",
                *[latex_escape(note) + "\\par" for note in t.notes], "\\end{minipage}"]
    return out + ["\\end{table}", ""]


@register_renderer("tex")
def latex(tables: Sequence[Table], heading: str = "") -> str:
    """LaTeX ``table`` environments (needs ``\\usepackage{booktabs}``)."""
    out = ["% generated by capsmed; needs \\usepackage{booktabs}"]
    out += [f"% {heading}"] if heading else []
    out.append("")
    for t in tables:
        out += latex_table(t)
    return "\n".join(out)
