"""Atomic file output: write to a temporary name in the same folder, then rename.

A crash or an error mid-write never leaves a half-written file under the final name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from capsmed.errors import CapsmedError


def ensure_writable_dir(path: Path) -> None:
    """Create ``path`` (and parents) or fail with a one-line message naming it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CapsmedError(f"{path}: cannot create folder ({exc.strerror})") from exc
    if not os.access(path, os.W_OK):
        raise CapsmedError(f"{path}: folder is not writable")


@contextlib.contextmanager
def atomic_path(final: Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``final``; rename it onto ``final`` on success.

    On any exception the temporary file is removed and ``final`` is left untouched.
    """
    final = Path(final)
    ensure_writable_dir(final.parent)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=f"{suffix}.tmp",
                                    dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        if tmp.exists():  # mkstemp makes files 0600; give them the usual umask mode
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``final``; rename it onto ``final`` on success.

    ``final`` must not exist or be an empty folder; on error the partial folder is removed.
    """
    final = Path(final)
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise CapsmedError(f"{final}: already exists and is not empty; choose another folder")
    ensure_writable_dir(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes folders 0700
        if final.exists():
            final.rmdir()
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(Path(path)) as tmp:
        tmp.write_text(text, encoding="utf-8")
