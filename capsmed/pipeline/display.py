"""What ``capsmed run`` shows while it works: a live table on a terminal, plain lines in
a log or CI (both fit 80 columns)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

SHOWN_RUNNING = 8


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"


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
        table = Table(box=None, show_header=bool(self.running), pad_edge=False)
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
            self.live.console.print(Text(text))
            self.live.update(self._render())
        else:
            self.console.print(Text(text), soft_wrap=True)

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
        minutes = f"{seconds / 60:.1f} min"
        if not failures:
            self.console.print(f"{self.name}: all {self.total} runs done ({minutes}); "
                               f"results in {state.out}")
            return
        self.console.print(f"{self.name}: {len(failures)} failed, {len(self.done)} done "
                           f"({minutes}). Failed:")
        for label, reason in failures.items():
            self.console.print(f"  {label}: {reason}", soft_wrap=True)
        self.console.print("Rerun the same command to retry them (finished runs are "
                           "skipped).")


def status_table(name: str, rows: Sequence[Mapping[str, Any]], fields: Sequence[str],
                 estimate: Mapping[str, str] | None = None) -> Table:
    """The expanded grid (``--dry-run``) or its progress (``capsmed run status``)."""
    table = Table(title=f"{name}: {len(rows)} runs", title_justify="left", box=None,
                  pad_edge=False)
    table.add_column("#", justify="right")
    for f in fields:
        table.add_column(f, no_wrap=True, overflow="ellipsis", max_width=18)
    table.add_column("id", no_wrap=True)
    table.add_column("status", no_wrap=True)
    if estimate:
        table.add_column("est.", justify="right", no_wrap=True)
    for i, row in enumerate(rows, 1):
        cells = [str(i), *[str(row["fields"].get(f, "")) for f in fields],
                 row["id"] or "(after data)", row["status"]]
        if estimate:
            cells.append(estimate.get(row["label"], "-"))
        table.add_row(*cells)
    return table
