"""What the fault tests share: the CLI runner and the one assertion they all make."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from capsmed.cli import app

TINY_LENET = {"widths": [3, 4], "hidden": [8]}
runner = CliRunner()


def invoke(args: Sequence[str]) -> Any:
    return runner.invoke(app, ["-q", *map(str, args)])


def lenet_args(data: Path, out: Path, *extra: str, arch: str = "lenet") -> list[str]:
    """``capsmed train`` arguments of a tiny one-epoch run (lenet at reduced widths; a
    width ``extra`` gives is given once, as a repeated key is refused)."""
    given = {str(v).partition("=")[0] for k, v in zip(extra, extra[1:], strict=False)
             if k == "--model-arg"}
    tiny = [a for key, value in (("widths", "[3,4]"), ("hidden", "[8]")) if key not in given
            for a in ("--model-arg", f"{key}={value}")] if arch == "lenet" else []
    return ["train", "--data", data, "--arch", arch, "--epochs", "1", "--batch-size", "16",
            *tiny, "--out", out, *extra]


def assert_refused(result: Any, names: str | Path, *, code: int = 1,
                   text: str | None = None, absent: Sequence[Path] = (),
                   unchanged: dict[Path, bytes] | None = None) -> str:
    """The promise for bad input: exit ``code``, exactly one ``error:`` line on stderr
    naming ``names`` (and holding ``text``), no traceback, nothing left at ``absent``
    nor a temporary file beside it, and the files of ``unchanged`` as they were.
    Returns the error line."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    # an exception the CLI did not handle would have printed a traceback
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    line = lines[0]
    assert str(names) in line, line
    if text is not None:
        assert text in line, line
    for path in absent:
        assert not path.exists() or (path.is_dir() and not any(path.iterdir())), path
        assert not list(path.parent.glob(f".{path.name}*")), f"temporary left beside {path}"
    for path, content in (unchanged or {}).items():
        assert path.read_bytes() == content, f"{path} changed"
    return line
