"""What ``capsmed run`` shows while it works: a live table on a terminal, plain lines in
a log or CI (both fit 80 columns)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table as RichTable
from rich.text import Text

from capsmed.tables import Column, Table, text_column
from capsmed.tables.terminal import to_rich

SHOWN_RUNNING = 8
SHOWN_FAILED = 10


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"


def _wrap(text: str, width: int, indent: str = "") -> Text:
    """``text`` wrapped at spaces to ``width`` (80 in a log), its later lines indented:
    a word (a path, a run's name) is never split; only one wider than a line runs
    past it."""
    import textwrap

    return Text(textwrap.fill(text, width=max(40, width), initial_indent=indent,
                              subsequent_indent=indent + "  ", break_long_words=False,
                              break_on_hyphens=False))


class RunBoard:
    """Counts of runs pending / running / done / failed, and the runs in progress."""

    def __init__(self, name: str, total: int, console: Console | None = None) -> None:
        self.name, self.total = name, total
        self.console = console or Console(highlight=False)
        self.running: dict[str, tuple[float, str | None]] = {}
        self.done: set[str] = set()
        self.failed: dict[str, str] = {}
        self.live: Live | None = None

    def __enter__(self) -> RunBoard:
        if self.console.is_terminal:
            self.live = Live(self._render(), console=self.console, refresh_per_second=2,
                             transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(*exc)
            self.live = None

    def _render(self) -> Group:
        pending = self.total - len(self.done) - len(self.failed) - len(self.running)
        head = Text(f"{self.name}: {len(self.done)} done, {len(self.running)} running, "
                    f"{max(0, pending)} pending, {len(self.failed)} failed "
                    f"(of {self.total})")
        table = RichTable(box=None, show_header=bool(self.running), pad_edge=False)
        table.add_column("running", no_wrap=True, max_width=60)
        table.add_column("for", justify="right", no_wrap=True)
        now = time.monotonic()
        for label, (since, detail) in list(self.running.items())[:SHOWN_RUNNING]:
            note = f" ({detail})" if detail else ""
            table.add_row(_fit(label + note, 60), f"{int(now - since) // 60}m"
                          f"{int(now - since) % 60:02d}s")
        if len(self.running) > SHOWN_RUNNING:
            table.add_row(f"... and {len(self.running) - SHOWN_RUNNING} more", "")
        return Group(head, table)

    def _line(self, text: str) -> None:
        """An event or note, whole: wrapped at the terminal's width, never cut (a cut
        line lost the run it was about); plain text, not rich markup."""
        if self.live is not None:
            self.live.console.print(_wrap(text, self.live.console.width), soft_wrap=True)
            self.live.update(self._render())
        else:
            self.console.print(_wrap(text, self.console.width), soft_wrap=True)

    def note(self, text: str) -> None:
        self._line(text)

    def event(self, what: str, label: str, detail: str | None = None) -> None:
        """A run started (``running``), finished (``done``) or gave up (``failed``)."""
        if what == "running":
            self.running[label] = (time.monotonic(), detail)
            if self.live is None:
                self._line(f"start  {label}" + (f" ({detail})" if detail else ""))
            else:
                self.live.update(self._render())
            return
        self.running.pop(label, None)
        if what == "done":
            self.done.add(label)
            count = f"[{len(self.done) + len(self.failed)}/{self.total}]"
            self._line(f"{count} done   {label}" + (f" ({detail})" if detail else ""))
        else:
            self.failed[label] = detail or "failed"
            count = f"[{len(self.done) + len(self.failed)}/{self.total}]"
            self._line(f"{count} FAILED {label}")

    def summary(self, failures: Mapping[str, str], seconds: float, state: Any) -> None:
        minutes, width = f"{seconds / 60:.1f} min", self.console.width
        if not failures:
            self.console.print(_wrap(f"{self.name}: all {self.total} runs done ({minutes}); "
                                     f"results in {state.out}", width), soft_wrap=True)
            return
        self.console.print(_wrap(f"{self.name}: {len(failures)} failed, {len(self.done)} "
                                 f"done ({minutes}). Failed:", width), soft_wrap=True)
        for label, reason in failures.items():
            self.console.print(_wrap(f"{label}: {reason}", width, "  "), soft_wrap=True)
        self.console.print(_wrap("Rerun the same command to retry them (finished runs "
                                 "are skipped).", width), soft_wrap=True)


def summary_table(groups: Mapping[str, Sequence[Any]], header: str,
                  extra: Mapping[str, Mapping[str, str]] | None = None,
                  width: int | None = None) -> RenderableType:
    """One row per group of runs: how many, where they stand, and (``extra``: column
    name -> group -> text) what they ask for and how long they should take; fitted to
    ``width`` columns (the terminal's by default)."""
    from capsmed.pipeline.status import counts, describe_counts

    columns = [text_column(header), Column("runs"), Column("status", align="left", wrap=True)]
    columns += [Column(n) if n == "est." else Column(n, align="left", wrap=True)
                for n in extra or {}]
    cells = [[key, str(len(rows)), describe_counts(counts(rows)),
              *((extra or {})[n].get(key, "-") for n in extra or {})]
             for key, rows in groups.items()]
    return to_rich(Table("", columns, cells), width or Console().width)


def run_lines(rows: Sequence[Any], estimates: Mapping[str, str] | None = None) -> str:
    """Every run on a line (``--list``): label, identity, status and detail, plain text
    (fast for 10,000 runs); a long label is shortened, never split mid-word."""
    lines = []
    for i, row in enumerate(rows, 1):
        est = f" {estimates.get(row.label, '-'):>6}" if estimates is not None else ""
        detail = f" ({row.detail})" if row.detail else ""
        lines.append(f"{i:>5} {_fit(row.label, 34):<34} {row.run_id or '(after data)':<12} "
                     f"{row.status}{est}{detail}")
    return "\n".join(lines)


def print_overview(view: Any, console: Console, list_all: bool, dry_run: bool) -> None:
    """``capsmed run status`` / ``--dry-run``: counts, the groups (every run with
    ``list_all``), the failures with their reasons, and for a dry run what each group
    asks for and how long it should take."""
    from capsmed.pipeline.estimate import human
    from capsmed.pipeline.status import FAILED, counts, describe_counts

    name, rows = view.pipeline.name, view.rows
    console.print(Text(f"{name}: {len(rows)} runs ({describe_counts(counts(rows))}); "
                       f"output: {view.pipeline.out}"))
    for line in view.stages:
        console.print(Text(line))
    estimates = {k: human(v) for k, v in view.estimates.items()} if dry_run else None
    if list_all:
        console.print(Text(run_lines(rows, estimates)), soft_wrap=True)
    else:
        extra: dict[str, dict[str, str]] = {}
        if dry_run:
            extra["resources"] = view.resources
            extra["est."] = {key: _group_estimate(
                [r for r in members if r.label not in view.trained], view.estimates, human)
                for key, members in view.groups.items()
                if any(r.label in view.estimates for r in members)}
        console.print(summary_table(view.groups, " ".join(view.fields) or "runs", extra,
                                    console.width))
    failed = [r for r in rows if r.status == FAILED]
    for row in failed[:SHOWN_FAILED] if not list_all else []:
        console.print(Text(f"  failed {row.label}: {row.detail}"), soft_wrap=False)
    if len(failed) > SHOWN_FAILED and not list_all:
        console.print(Text(f"  ... and {len(failed) - SHOWN_FAILED} more failed (--list)"))
    if view.foreign:
        console.print(Text(f"{len(view.foreign)} folder(s) in {view.foreign[0].parent} "
                           "belong to no run of this pipeline now (their options, data or "
                           "capsmed's protocol revision changed) and are not counted, e.g. "
                           f"{view.foreign[0].name}; remove them when you no longer need "
                           "them"))
    if dry_run:
        console.print(Text(view.estimate_note))
        print_claims(view.pipeline.claims, console)


def _group_estimate(members: Sequence[Any], estimates: Mapping[str, float], human: Any
                    ) -> str:
    """The group's total, and how many of its runs to train it covers when not all."""
    known = [estimates[r.label] for r in members if r.label in estimates]
    return human(sum(known)) + ("" if len(known) == len(members) else
                                f" ({len(known)} of {len(members)})")


def print_claims(claims: Sequence[Any], console: Console) -> None:
    """The paper's claims the study will test (``--dry-run``), wrapped at 80 columns."""
    from capsmed.pipeline.study_claims import claim_lines

    for line in claim_lines(claims, min(console.width, 80)):
        console.print(Text(line), soft_wrap=True)
