"""What every command shares: one-line errors with exit codes 1 / 130, logging set-up."""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import typer

from capsmed.errors import CapsmedError, Interrupted

F = TypeVar("F", bound=Callable[..., Any])


def echo_wrapped(text: str) -> None:
    """``text`` wrapped at the terminal's width (80 columns in a log), paths unbroken:
    a list of the files written reads as lines, not one 300-column line. A quoted path
    (:func:`capsmed.errors.shell_quoted`) is not broken at its spaces either, so that a
    command suggested in ``text`` pastes whole."""
    import re
    import shutil
    import textwrap

    keep = "\ue000"  # a private-use character: stands in for a quoted space meanwhile
    text = re.sub(r"'[^']*'", lambda m: m.group().replace(" ", keep), text)
    width = shutil.get_terminal_size((80, 24)).columns
    typer.echo(textwrap.fill(text, width=max(40, width), subsequent_indent="  ",
                             break_long_words=False,
                             break_on_hyphens=False).replace(keep, " "))


def handles_errors(command: F | None = None, *, sigterm: bool = True) -> Any:
    """Report a failure as one ``error: <message>`` line on stderr and an exit code.

    The codes (README "Errors and exit codes"): 1 for a :class:`CapsmedError`, 130 for
    an interruption: Ctrl-C, SIGTERM (turned into the same ``KeyboardInterrupt`` while
    the command runs) or a training run that stopped on request and can be resumed
    (:class:`capsmed.errors.Interrupted`). No traceback either way.

    Use as ``@handles_errors``, or ``@handles_errors(sigterm=False)`` for a command
    that supervises child processes and must not wait for them on SIGTERM (the
    default action, dying at once, then reaches them through ``PR_SET_PDEATHSIG``).
    """
    if command is None:
        return functools.partial(handles_errors, sigterm=sigterm)

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with _sigterm_interrupts(sigterm):
                return command(*args, **kwargs)
        except CapsmedError as exc:
            sys.stderr.write(f"error: {one_line(str(exc))}\n")
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt as exc:
            reason = f" ({exc.args[0]})" if exc.args else ""
            sys.stderr.write(f"error: interrupted{reason}\n")
            raise typer.Exit(Interrupted.exit_code) from None

    return wrapper


def one_line(message: str) -> str:
    """``message`` on one line: a library's multi-line text must not break the
    one-``error:``-line promise."""
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


@contextlib.contextmanager
def _sigterm_interrupts(enabled: bool) -> Iterator[None]:
    """While a command runs, SIGTERM (a scheduler, ``kill``) stops it as Ctrl-C does:
    temporary files are removed on the way out and the exit code is 130. Training
    installs its own handler inside this one (finish the step, save, then stop)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def fit_to_width(renderable: Any, width: int) -> Any:
    """``renderable`` with every table too wide for ``width`` columns turned on its side.

    A table of one column per class (15 AML classes, ``capsmed data info``) cut every
    class name to '…' at 80 columns; transposed, the classes are rows and the few
    splits or folds are columns, so every name is readable.
    """
    from rich.console import Console, Group
    from rich.table import Table

    if isinstance(renderable, Group):
        return Group(*(fit_to_width(r, width) for r in renderable.renderables))
    if not isinstance(renderable, Table) or len(renderable.columns) < 3:
        return renderable
    # below its minimum (the longest word of each column) rich cuts words to '…';
    # measured unconstrained, as rich clamps a measurement to the console's width
    if Console(width=10_000).measure(renderable).minimum <= width:
        return renderable
    return _transposed(renderable)


def _transposed(table: Any) -> Any:
    from rich.table import Table

    columns = table.columns
    out = Table(title=table.title, caption=table.caption)
    out.add_column(str(columns[0].header), no_wrap=True)  # what the new columns are
    for label in columns[0].cells:
        out.add_column(str(label), justify="right", no_wrap=True)
    for column in columns[1:]:
        out.add_row(str(column.header), *(str(cell) for cell in column.cells))
    return out


def setup_logging(level: int) -> None:
    """Route library logs through rich on stderr (stdout stays for tables and results)."""
    from rich.logging import RichHandler

    from capsmed.progress import stderr_console

    root = logging.getLogger("capsmed")
    root.handlers.clear()
    handler = RichHandler(console=stderr_console, show_path=False, show_time=False,
                          markup=False)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def parse_key_values(pairs: list[str] | None, option: str) -> dict[str, Any]:
    """``["a=1", "b=[2,3]"]`` -> ``{"a": 1, "b": [2, 3]}`` (values parsed as YAML scalars,
    by :func:`capsmed.yamlfile.load_value`: ``no``, ``010``, ``1:30`` refused); a key given
    twice is refused."""
    from capsmed.yamlfile import load_value

    out: dict[str, Any] = {}
    given: dict[str, str] = {}  # key -> the value as typed, to name a repeated key
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CapsmedError(f"{option} expects key=value, got '{pair}'")
        key = key.strip().replace("-", "_")
        if key in given:  # the last one silently won
            raise CapsmedError(f"{option} {key} given twice ('{given[key]}' and "
                               f"'{value}'); give it once")
        given[key] = value
        out[key] = load_value(value, f"{option} {key}")  # seeds=[010]: refused, not 8
    return out


def only_set(**values: Any) -> dict[str, Any]:
    """Drop None values: CLI options override defaults only when given."""
    return {k: v for k, v in values.items() if v is not None}


def parse_split_files(pairs: list[str] | None, fractions: dict[str, float] | None = None
                      ) -> dict[str, str] | None:
    """``--split-file train=a.txt`` (repeatable) -> ``{"train": "a.txt"}``: known splits,
    each once, the path as typed (not read as YAML). ``fractions``: the split fractions
    given on the command line, which split files replace: both at once are refused."""
    files: dict[str, str] = {}
    for pair in pairs or []:
        split, sep, path = (part.strip() for part in pair.partition("="))
        if not sep or not split or not path:
            raise CapsmedError(f"--split-file expects SPLIT=FILE, got '{pair}'")
        if split not in ("train", "val", "test"):
            raise CapsmedError(f"--split-file: unknown split {split} (use train, val, test)")
        if split in files:  # the first list's groups would be dropped from the split
            raise CapsmedError(f"--split-file: {split} is given twice ({files[split]} and "
                               f"{path}); give one file per split")
        files[split] = path
    if files and fractions:
        raise CapsmedError("--split-file replaces the split fractions; drop --train/--val/"
                           "--test, or the split files")
    return files or None
