"""A :class:`capsmed.tables.Table` for the terminal, fitted to its width (80 columns in a
log, a pipe or CI).

rich alone squeezes a wide table by wrapping every column, which split run names and
even headers mid-word (``tupac16-capsne`` / ``t``) and cut numbers. Here the widths are
decided first, in this order, stopping as soon as the table fits:

1. headers wrap at their spaces, then take their short form (``Column.short``);
2. names longer than ``SOFT_FLOOR`` characters are shortened to it;
3. columns of priority > 0 are left out, the highest priority first (a note names them);
4. the table is shown in parts one under another, each with the row labels (the
   leading text columns) and as many other columns as fit, span groups together;
5. name columns are shortened to ``MAIN_FLOOR``, then to ``LAST_FLOOR``.

Room left once a column is left out or the table split goes back to shortened names.

A name is shortened by leaving out whole parts between its separators (``-_/ :``),
parts that every row shares first, and marking the gap with ``…``; it is never wrapped
onto a second line. Numbers are never shortened or wrapped. Two different names of a
column are never shortened to the same text (the rows' numbers would be told apart by
nothing): a column narrower than that is not taken.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich import box
from rich.cells import cell_len, set_cell_size
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table as RichTable
from rich.text import Text

from capsmed.tables import Table

ELLIPSIS = "…"
GAP = 2  # columns between two cells: one space of padding and one of rule
# name columns are shortened to these widths, step by step (see the module's text)
SOFT_FLOOR, MAIN_FLOOR, LAST_FLOOR = 30, 16, 8
# no outer edge or vertical rules; a rule under the header and above total rows
RULES = box.Box("    \n    \n ── \n    \n ── \n ── \n    \n    \n")
# a name's parts end at these separators ("." is left out: 0.5, tupac16.h5 stay whole)
_PART = re.compile(r"[^-_/ :]+[-_/ :]*|[-_/ :]+")


def _render_parts(parts: Sequence[str], keep: Sequence[bool]) -> str:
    out, gap = [], False
    for part, kept in zip(parts, keep, strict=True):
        if kept:
            out.append(part)
            gap = False
        elif not gap:
            out.append(ELLIPSIS)
            gap = True
    return "".join(out)


def shorten(text: str, width: int, shared: Counter[str] | None = None,
            last_part_last: bool = True) -> str:
    """``text`` in at most ``width`` characters, whole parts left out (``…`` marks the
    gap): the parts most other names share first, then from the middle outwards, the
    last part last (unless ``last_part_last`` is False). When no part fits, the start
    of the name is kept, cut.

    >>> shorten("runs/tupac16-capsnet-full-seed0", 20)
    'runs/…full-seed0'
    """
    if cell_len(text) <= width:
        return text
    parts = _PART.findall(text)
    shared = shared or Counter()
    middle = (len(parts) - 1) / 2
    order = sorted(range(len(parts)), key=lambda i: (
        last_part_last and i == len(parts) - 1, -shared[parts[i]], abs(i - middle)))
    keep = [True] * len(parts)
    for i in order[:-1]:  # one part always stays
        keep[i] = False
        candidate = _render_parts(parts, keep)
        if cell_len(candidate) <= width:
            return candidate
    for i in reversed(order):  # the one part left is too wide: another one alone
        candidate = _render_parts(parts, [k == i for k in range(len(parts))])
        if cell_len(candidate) <= width:
            return candidate
    # every part is wider than the column
    return set_cell_size(text, max(1, width - 1)).rstrip() + ELLIPSIS


def shorten_names(values: Sequence[str], width: int) -> list[str]:
    """Each value shortened to ``width``; parts shared by many values go first, so the
    parts that tell rows apart stay (``…-capsnet-…-seed0`` and ``…-lenet-…-seed0``).

    Names that still come out alike (``…erythroblast`` for ``myeloblast_abnormal_
    erythroblast`` and ``myeloblast_normal_erythroblast``) are shortened again, parts
    counted as shared among them only and the last part no longer kept first. They may
    still be alike: the terminal's fitting then leaves the column wider."""
    shared = Counter(p for v in set(values) for p in set(_PART.findall(v)))
    short = {v: shorten(v, width, shared) for v in set(values)}
    alike: dict[str, list[str]] = {}
    for v, s in short.items():
        alike.setdefault(s, []).append(v)
    for names in (ns for ns in alike.values() if len(ns) > 1):
        among = Counter(p for v in names for p in set(_PART.findall(v)))
        again = {v: shorten(v, width, among, last_part_last=False) for v in names}
        others = {s for v, s in short.items() if v not in again}
        if len(set(again.values())) == len(names) and not others & set(again.values()):
            short |= again
    return [short[v] for v in values]


@dataclass
class Layout:
    """Which columns are shown, how wide, under which headers, and what was changed."""

    shown: list[int]
    widths: dict[int, int]
    headers: dict[int, str]
    dropped: list[str] = field(default_factory=list)
    chunks: list[list[int]] = field(default_factory=list)  # parts shown one under another

    def parts(self) -> list[list[int]]:
        return self.chunks or [self.shown]

    def width_of(self, columns: list[int]) -> int:
        return sum(self.widths[i] for i in columns) + GAP * (len(columns) - 1)

    def total(self) -> int:
        return max(self.width_of(part) for part in self.parts())


def _words(text: str) -> int:
    return max((cell_len(w) for w in text.split()), default=0)


def _cell_width(t: Table, i: int) -> int:
    """The widest line of column ``i``; a prose column needs only its longest word."""
    if t.columns[i].wrap:
        return max((_words(row[i]) for row in t.rows), default=0)
    return max((cell_len(line) for row in t.rows for line in row[i].split("\n")),
               default=0)


class _Fitter:
    """The steps of :func:`layout`, each narrowing the table a little more."""

    def __init__(self, t: Table, width: int) -> None:
        self.t, self.width = t, width
        self.cells = {i: _cell_width(t, i) for i in range(len(t.columns))}
        self.whole = True  # headers on one line
        self.floors: dict[int, int] = {}  # name columns kept wider (keep_apart)
        self.apart_at: dict[tuple[int, int], bool] = {}
        self.fit = Layout(shown=list(range(len(t.columns))), widths={},
                          headers={i: c.header for i, c in enumerate(t.columns)})
        self.settle()

    def header_width(self, i: int) -> int:
        if not self.t.show_header:
            return 0
        head, span = self.fit.headers[i], self.t.columns[i].span
        if self.whole:
            return max(cell_len(head), cell_len(span))
        return max(_words(head), _words(span))

    def settle(self) -> None:
        self.fit.widths = {i: max(w, self.header_width(i), 1) for i, w in self.cells.items()}

    def fits(self) -> bool:
        return self.fit.total() <= self.width

    def wrap_headers(self) -> None:
        self.whole = False
        self.settle()

    def short_headers(self) -> None:
        for i, c in enumerate(self.t.columns):
            self.fit.headers[i] = c.short or c.header
        self.settle()

    def apart(self, i: int, width: int) -> bool:
        """Whether name column ``i`` shortened to ``width`` still shows each of its
        different names as a different text (else two rows' numbers would be told apart
        by nothing)."""
        if (i, width) not in self.apart_at:
            cells = [row[i] for row in self.t.rows]
            self.apart_at[i, width] = (width >= _cell_width(self.t, i) or len(set(
                _shorten_column(cells, width))) == len(set(cells)))
        return self.apart_at[i, width]

    def keep_apart(self, columns: Sequence[int]) -> bool:
        """Widen each of ``columns`` too narrow to keep its names apart to the next width
        that does; that width becomes its floor. Whether one was widened."""
        alike = [i for i in columns if not self.apart(i, self.cells[i])]
        for i in alike:
            while not self.apart(i, self.cells[i]):
                self.cells[i] += 1
            self.floors[i] = self.cells[i]
        self.settle()
        return bool(alike)

    def shrink(self, floor: int) -> None:
        """Narrow the widest name column one character at a time down to ``floor``; a
        column whose names would come out alike is widened back (:meth:`keep_apart`)
        and the others narrowed instead."""
        columns = [i for i in self.fit.shown if self.t.columns[i].name]
        while True:
            while not self.fits():
                room = [i for i in columns if self.cells[i] > max(
                    floor, self.header_width(i), self.floors.get(i, 0))]
                if not room:
                    break
                widest = max(room, key=lambda i: self.cells[i])
                self.cells[widest] -= 1
                self.settle()
            if not self.keep_apart(columns):
                return

    def widen_prose(self) -> None:
        """Prose columns take what the others leave, up to their longest line."""
        prose = [i for i in self.fit.shown if self.t.columns[i].wrap]
        if not prose:
            return
        room = max(0, self.width - self.fit.total())
        for i in prose:
            longest = max((cell_len(line) for row in self.t.rows for line in row[i].split("\n")),
                          default=0)
            extra = min(room // len(prose), max(0, longest - self.fit.widths[i]))
            self.fit.widths[i] += extra

    def grow(self) -> None:
        """Give room left after a column was dropped or the table split back to
        shortened names."""
        natural = {i: _cell_width(self.t, i) for i in self.fit.shown}
        while self.fit.total() < self.width:
            short = [i for i in self.fit.shown if self.cells[i] < natural[i]]
            if not short:
                return
            self.cells[max(short, key=lambda i: natural[i] - self.cells[i])] += 1
            self.settle()

    def split(self) -> None:
        """Show the table in parts one under another, each with the leading text columns
        (the row labels) and as many of the rest as fit, span groups kept together."""
        stub = [i for k, i in enumerate(self.fit.shown) if self.t.columns[i].align == "left"
                and all(self.t.columns[j].align == "left" for j in self.fit.shown[:k])]
        stub = stub or self.fit.shown[:1]
        groups: list[list[int]] = []
        for i in self.fit.shown[len(stub):]:
            if groups and self.t.columns[groups[-1][-1]].span == self.t.columns[i].span:
                groups[-1].append(i)
            else:
                groups.append([i])
        chunks: list[list[int]] = []
        for group in groups:
            whole = chunks and self.fit.width_of(chunks[-1] + group) <= self.width
            if whole:
                chunks[-1] += group
                continue
            for i in group:  # a new part; a group too wide alone goes column by column
                if chunks and len(chunks[-1]) > len(stub) and \
                        self.fit.width_of(chunks[-1] + [i]) <= self.width and \
                        self.t.columns[chunks[-1][-1]].span == self.t.columns[i].span:
                    chunks[-1].append(i)
                else:
                    chunks.append([*stub, i])
        self.fit.chunks = chunks if len(chunks) > 1 else []

    def drop(self) -> None:
        """Leave out columns of priority > 0, the highest priority (then rightmost) first."""
        order = sorted((i for i, c in enumerate(self.t.columns) if c.priority > 0),
                       key=lambda i: (-self.t.columns[i].priority, -i))
        labels = self.t.header_labels()
        for i in order:
            if self.fits():
                return
            self.fit.shown.remove(i)
            self.fit.dropped.append(labels[i])


def layout(t: Table, width: int) -> Layout:
    """Decide the columns shown and their widths for ``width`` terminal columns."""
    f = _Fitter(t, width)
    steps = (f.wrap_headers, f.short_headers, lambda: f.shrink(SOFT_FLOOR), f.drop,
             f.split,
             lambda: f.shrink(MAIN_FLOOR), lambda: f.shrink(LAST_FLOOR))
    for step in steps:
        if f.fits():
            break
        step()
    if f.fit.dropped or f.fit.chunks:
        f.grow()
        f.keep_apart([i for i in f.fit.shown if t.columns[i].name])
    f.widen_prose()
    return f.fit


def _shorten_column(cells: list[str], width: int) -> list[str]:
    """Each line of each cell shortened to ``width``, lines of one position across the
    rows shortened together (their shared parts go first)."""
    lines = [c.split("\n") for c in cells]
    depth = max(map(len, lines))
    padded = [ls + [""] * (depth - len(ls)) for ls in lines]
    short = [shorten_names([row[k] for row in padded], width) for k in range(depth)]
    return ["\n".join(short[k][r] for k in range(len(lines[r]))) for r in range(len(cells))]


def _rich_part(t: Table, fit: Layout, part: list[int], cells: dict[int, list[str]]
               ) -> RichTable:
    spans = any(t.columns[i].span for i in part)
    table = RichTable(box=RULES, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
                      show_header=t.show_header)
    for i in part:
        c = t.columns[i]
        header = f"{c.span}\n{fit.headers[i]}" if spans else fit.headers[i]
        table.add_column(escape(header), justify=c.align, width=fit.widths[i],
                         overflow="fold")
    first_total = len(t.rows) - t.total_rows
    for k in range(len(t.rows)):
        table.add_row(*(escape(cells[i][k]) for i in part),
                      style="bold" if k >= first_total else None,
                      end_section=t.row_rules or (bool(t.total_rows)
                                                   and k == first_total - 1))
    return table


def to_rich(t: Table, width: int, notes: bool = True) -> RenderableType:
    """The table as a rich renderable at most ``width`` columns wide: title, table (in
    parts one under another when its columns do not fit side by side) and notes, plus a
    note on what was left out or shortened to fit."""
    fit = layout(t, width)
    cells = {i: [row[i] for row in t.rows] for i in fit.shown}
    shortened = False
    for i in fit.shown:
        if t.columns[i].name and _cell_width(t, i) > fit.widths[i]:
            cells[i] = _shorten_column(cells[i], fit.widths[i])
            shortened = True
    out: list[RenderableType] = [Text(t.title, style="bold")] if t.title else []
    for k, part in enumerate(fit.parts()):
        out += [Text("")] if k else []
        out.append(_rich_part(t, fit, part, cells))
    extra = []
    if fit.dropped:
        extra.append(f"not shown in {width} columns: {', '.join(fit.dropped)} (a wider "
                     f"terminal shows {'them' if len(fit.dropped) > 1 else 'it'})")
    if shortened:
        extra.append(f"{ELLIPSIS} marks parts of a name left out to fit {width} columns")
    out += [Text(note) for note in [*(t.notes if notes else []), *extra]]
    return Group(*out)


def print_tables(tables: Sequence[Table], console: Console | None = None,
                 notes: bool = True) -> None:
    """Print ``tables`` on ``console`` (stdout), each fitted to its width, a blank line
    between them."""
    console = console or Console(highlight=False)
    for k, t in enumerate(tables):
        if k:
            console.print()
        console.print(to_rich(t, console.width, notes))
