"""What every command shares: one-line errors with a non-zero exit, logging set-up."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from capsmed.errors import CapsmedError

F = TypeVar("F", bound=Callable[..., Any])


def handles_errors(command: F) -> F:
    """Turn a :class:`CapsmedError` into ``error: <message>`` on stderr and exit code 1."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except CapsmedError as exc:
            sys.stderr.write(f"error: {exc}\n")
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            sys.stderr.write("error: interrupted\n")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


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
    """``["a=1", "b=[2,3]"]`` -> ``{"a": 1, "b": [2, 3]}`` (values parsed as YAML scalars)."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CapsmedError(f"{option} expects key=value, got '{pair}'")
        out[key.strip().replace("-", "_")] = yaml.safe_load(value)
    return out


def only_set(**values: Any) -> dict[str, Any]:
    """Drop None values: CLI options override defaults only when given."""
    return {k: v for k, v in values.items() if v is not None}


def parse_split_files(pairs: list[str] | None) -> dict[str, str] | None:
    """``--split-file train=a.txt`` (repeatable) -> ``{"train": "a.txt"}``, splits checked."""
    files = parse_key_values(pairs, "--split-file")
    bad = sorted(set(files) - {"train", "val", "test"})
    if bad:
        raise CapsmedError(f"--split-file: unknown split(s) {', '.join(bad)} "
                           "(use train, val, test)")
    return {k: str(v) for k, v in files.items()} or None
