"""One table model for every table capsmed shows or writes.

A :class:`Table` holds what a reader sees (formatted cells, column headers, notes) and,
separately, the raw numbers a CSV should hold, so a spreadsheet never parses
``0.912 ± 0.004``. Renderers turn it into text; each is one function registered under
the file suffix it writes:

* :mod:`capsmed.tables.text`: Markdown (``md``), CSV (``csv``), LaTeX booktabs (``tex``);
* :mod:`capsmed.tables.html`: HTML fragments (``html``) for self-contained pages;
* :mod:`capsmed.tables.terminal`: rich renderables fitted to the terminal's width, where
  low-priority columns are dropped or headers abbreviated before a name is shortened,
  and a name is shortened at its separators, never split mid-word.

A new file format is one module with a function of the :class:`TableRenderer` shape and
one :func:`register_renderer` line (see the end of this file).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

PLUS_MINUS = "±"


@dataclass(frozen=True)
class Column:
    """One column of a :class:`Table`.

    Attributes:
        header: Leaf header.
        align: ``left`` for text, ``right`` for numbers.
        span: Group label above the header (paper 000's protocol over architectures);
            columns next to each other with the same span share it.
        priority: 0 = always shown; in a narrow terminal columns of priority k > 0 are
            left out, the highest k first, and a note names them.
        short: Header used when the full one does not fit (``sens.`` for
            ``sensitivity``); empty = the header's words wrap instead.
        name: The cells are names (runs, datasets, classes) that a narrow terminal may
            shorten at their separators (``tupac16-…-seed0``), never numbers.
        wrap: The cells are prose (a model's description): in the terminal the column
            takes the width the others leave and wraps at spaces.
    """

    header: str
    align: Literal["left", "right"] = "right"
    span: str = ""
    priority: int = 0
    short: str = ""
    name: bool = False
    wrap: bool = False


def text_column(header: str, **kw: Any) -> Column:
    """A left-aligned column of names that may be shortened."""
    return Column(header, align="left", name=True, **kw)


@dataclass
class Table:
    """A table as its readers see it.

    Attributes:
        title: Caption (Markdown heading, LaTeX caption, rich title); may be empty.
        columns: The columns, left to right.
        rows: Formatted cells, one list per row, as long as ``columns``; a cell may
            hold several lines (``name\nparameters``).
        total_rows: How many trailing rows are totals, set apart by a rule.
        notes: Sentences printed under the table.
        csv_columns, csv_rows: The machine-readable version (raw numbers); empty =
            the headers and the formatted cells.
        label: LaTeX label suffix.
        show_header: False for a key-value table (a run's context in report.html).
        row_rules: A rule between every two rows in the terminal (rows of several lines).
    """

    title: str
    columns: list[Column]
    rows: list[list[str]]
    total_rows: int = 0
    notes: list[str] = field(default_factory=list)
    csv_columns: list[str] = field(default_factory=list)
    csv_rows: list[list[Any]] = field(default_factory=list)
    label: str = ""
    show_header: bool = True
    row_rules: bool = False

    def __post_init__(self) -> None:
        self.rows = [[str(cell) for cell in row] for row in self.rows]
        if any(len(r) != len(self.columns) for r in self.rows):
            raise ValueError("every row needs one cell per column")

    @property
    def headers(self) -> list[str]:
        return [c.header for c in self.columns]

    def spans(self) -> list[tuple[str, int]]:
        """``(span label, number of adjacent columns)`` from left to right."""
        out: list[tuple[str, int]] = []
        for c in self.columns:
            if out and out[-1][0] == c.span:
                out[-1] = (c.span, out[-1][1] + 1)
            else:
                out.append((c.span, 1))
        return out

    def header_labels(self) -> list[str]:
        """Headers prefixed with their span (``protocol / arch``) for one-row headers."""
        return [f"{c.span} / {c.header}" if c.span and c.header else c.span or c.header
                for c in self.columns]

    def csv_table(self) -> tuple[list[str], list[list[Any]]]:
        """The CSV header and rows: the raw numbers where given, else the cells."""
        if self.csv_columns:
            return self.csv_columns, self.csv_rows
        return self.header_labels(), [list(r) for r in self.rows]


class TableRenderer(Protocol):
    """Renders tables, under an optional document heading, as the text of one file."""

    def __call__(self, tables: Sequence[Table], heading: str = "") -> str: ...


RENDERERS: dict[str, TableRenderer] = {}


def register_renderer(suffix: str) -> Callable[[TableRenderer], TableRenderer]:
    """Register a renderer under the file suffix it writes (``md``, ``csv`` ...)."""
    def add(renderer: TableRenderer) -> TableRenderer:
        RENDERERS[suffix] = renderer
        return renderer
    return add


def render(suffix: str, tables: Sequence[Table], heading: str = "") -> str:
    """The file text of ``tables`` in the format registered under ``suffix``."""
    return RENDERERS[suffix](tables, heading)


# the renderers register themselves; imported once, after the registry
from capsmed.tables import html, text  # noqa: E402,F401
