"""Progress bars for long work, drawn on stderr with rich and switchable off.

Library code calls :func:`track`; the CLI's ``--quiet`` flag (or ``disable=True``)
turns every bar off so logs and CI output stay clean.

Bars are drawn on a terminal only, and transient: they show work under way and vanish
when it ends, so what is left in a terminal or a log is what the logs and the command's
result lines say, once (a finished bar left behind repeated the last epoch's log line,
cut at 80 columns).
A text column passed to :func:`make_progress` (training's epoch summary) is drawn as a
line of its own under the bars, wrapped at the terminal's width instead of cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

T = TypeVar("T")

_state = {"enabled": True}
stderr_console = Console(stderr=True)


def set_progress_enabled(enabled: bool) -> None:
    """Globally enable or disable progress bars (the CLI's ``--quiet`` sets this)."""
    _state["enabled"] = enabled


class LinedProgress(Progress):
    """A Progress whose text columns are lines under the bars (one per task that has
    text), not columns squeezed beside them."""

    def __init__(self, *columns: ProgressColumn, lines: tuple[TextColumn, ...] = (),
                 **kwargs: Any) -> None:
        super().__init__(*columns, **kwargs)
        self.lines = lines

    def get_renderables(self) -> Iterator[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            for column in self.lines:
                text = column.render(task)
                if text.plain.strip():
                    yield Text(f"{task.description}: ").append_text(text)


def make_progress(*extra_columns: ProgressColumn, disable: bool | None = None) -> Progress:
    """A rich Progress with the project's standard columns plus ``extra_columns``
    (a :class:`TextColumn` among them is drawn as a line under the bars)."""
    off = (not _state["enabled"]) if disable is None else disable
    # no terminal (a log file, a pipe, CI): a bar is never drawn there, and a transient
    # one still left an empty line behind
    off = off or not stderr_console.is_terminal
    lines = tuple(c for c in extra_columns if isinstance(c, TextColumn))
    return LinedProgress(
        TextColumn("[bold blue]{task.description}", table_column=Column(no_wrap=True)),
        BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=10)),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        *(c for c in extra_columns if not isinstance(c, TextColumn)),
        lines=lines,
        console=stderr_console,
        disable=off,
        transient=True,
    )


def restart_task(progress: Progress, task: TaskID, description: str,
                 total: int | None) -> TaskID:
    """``task`` started again for new work: a fresh task in its place, since rich's
    ``reset(total=None)`` keeps the old total (a slide whose window count is found on
    the way showed the previous image's, ``slide_001.svs 81/15``)."""
    progress.remove_task(task)
    return progress.add_task(description, total=total)


def track(
    items: Iterable[T],
    description: str,
    total: int | None = None,
    disable: bool | None = None,
) -> Iterator[T]:
    """Iterate over ``items`` while drawing a progress bar labelled ``description``."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with make_progress(disable=disable) as progress:
        task = progress.add_task(description, total=total)
        for item in items:
            yield item
            progress.advance(task)
