"""Progress bars for long work, drawn on stderr with rich and switchable off.

Library code calls :func:`track`; the CLI's ``--quiet`` flag (or ``disable=True``)
turns every bar off so logs and CI output stay clean.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

T = TypeVar("T")

_state = {"enabled": True}
stderr_console = Console(stderr=True)


def set_progress_enabled(enabled: bool) -> None:
    """Globally enable or disable progress bars (the CLI's ``--quiet`` sets this)."""
    _state["enabled"] = enabled


def make_progress(*extra_columns, disable: bool | None = None) -> Progress:
    """A rich Progress with the project's standard columns plus any ``extra_columns``."""
    off = (not _state["enabled"]) if disable is None else disable
    return Progress(
        TextColumn("[bold blue]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        *extra_columns,
        console=stderr_console,
        disable=off,
        transient=False,
    )


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
