"""Atomic file output: write to a temporary name in the same folder, then rename.

A crash or an error mid-write never leaves a half-written file under the final name,
and a write that fails (a full disk, a read-only mount) is one :class:`WriteError`
line naming the file, not a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from capsmed.errors import CapsmedError, first_line

# Plain words for the errors a full or locked-down disk gives.
_REASONS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
            errno.EROFS: "read-only file system", errno.EACCES: "permission denied"}


class WriteError(CapsmedError):
    """A file could not be written; ``path`` is the file the user knows (never a
    temporary name)."""

    def __init__(self, path: Path, reason: str, advice: str = "") -> None:
        super().__init__(f"{path}: cannot write ({reason})" + (f"; {advice}" if advice else ""))
        self.path, self.reason, self.advice = Path(path), reason, advice


def write_failure(path: Path, exc: BaseException) -> WriteError:
    """``exc`` (raised while writing ``path``) as a :class:`WriteError`."""
    code = getattr(exc, "errno", None)
    reason = _REASONS.get(code) or getattr(exc, "strerror", None) or first_line(exc)
    return WriteError(path, reason)


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an ``OSError`` in the block into a :class:`WriteError` naming ``path``.

    Wrap writes only: an error reading something else would be blamed on ``path``.
    """
    try:
        yield
    except OSError as exc:
        raise write_failure(path, exc) from None


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
    with writing(final):
        fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=f"{suffix}.tmp",
                                        dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with writing(final):
            if tmp.exists():  # mkstemp makes files 0600; give them the usual umask mode
                os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (setting it to
    0 for an instant would give a file another thread of the runner creates then mode
    0666)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0)  # elsewhere: the classic read, set and put back
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
    with replace_dir(final) as tmp:  # replacing at most an empty folder
        yield tmp


@contextlib.contextmanager
def _naming_final(tmp: Path, final: Path) -> Iterator[None]:
    """A :class:`WriteError` about a file in the temporary folder ``tmp`` names its
    place in ``final`` instead: the user never sees the temporary name."""
    try:
        yield
    except WriteError as exc:
        if not exc.path.is_relative_to(tmp):
            raise
        raise WriteError(final / exc.path.relative_to(tmp), exc.reason, exc.advice) from None


@contextlib.contextmanager
def replace_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``final``; once the block succeeds, it replaces
    ``final`` (an earlier version is removed only then). On any error the temporary
    folder is removed, ``final`` is left as it was, and an ``OSError`` becomes a
    :class:`WriteError` naming ``final``."""
    final = Path(final)
    if final.exists() and not final.is_dir():
        raise CapsmedError(f"{final}: exists and is not a folder")
    ensure_writable_dir(final.parent)
    with writing(final):
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial",
                                    dir=final.parent))
    try:
        with _naming_final(tmp, final):
            yield tmp
        with writing(final):
            os.chmod(tmp, 0o777 & ~_umask())
            if not final.exists():
                os.replace(tmp, final)
                return
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old",
                                        dir=final.parent))
            os.replace(final, old)  # a folder may only replace an empty one
            try:
                os.replace(tmp, final)
            except OSError:
                os.replace(old, final)
                raise
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(Path(path)) as tmp, writing(path):
        tmp.write_text(text, encoding="utf-8")


def append_line(path: Path, line: str) -> None:
    """Append ``line`` and a newline to ``path`` (a log such as ``metrics.jsonl``).

    The line goes out in one ``write`` call; after a failed write (a full disk) a reader
    may find a partial last line, which it must skip.
    """
    with writing(path), Path(path).open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def user_data_dir() -> Path:
    """capsmed's folder for the user's own data (benchmark results): the platform's
    place, never the current folder. ``$XDG_DATA_HOME/capsmed`` (``~/.local/share``
    by default) on Linux, ``~/Library/Application Support/capsmed`` on macOS,
    ``%LOCALAPPDATA%\\capsmed`` on Windows."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "capsmed"


@contextlib.contextmanager
def output_lock(output: Path) -> Iterator[None]:
    """Hold ``.<name>.lock`` beside ``output`` (a file or folder being written) for the
    block: a second capsmed writing the same output is refused, one line naming it."""
    lock = output.parent / f".{output.name}.lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CapsmedError(f"{output}: another capsmed process is writing this file "
                               f"(it holds {lock.name}); wait for it to finish or choose "
                               "another output") from None
        # the previous owner may have removed the file between our open and flock
        if os.path.exists(lock) and os.stat(lock).st_ino == os.fstat(fd).st_ino:
            break
        os.close(fd)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.unlink(lock)  # while still holding it: a waiting run then makes a new one
        os.close(fd)


def stale_partial_dirs(final: Path) -> list[Path]:
    """Folders :func:`replace_dir` left beside ``final`` when its process was killed
    (``.<name>.`` + 8 characters + ``.partial`` or ``.old``), and nothing else: call it
    while holding :func:`output_lock`, so that none of them is another process's."""
    final = Path(final)
    pattern = re.compile(rf"\.{re.escape(final.name)}\.[A-Za-z0-9_]{{8}}\.(partial|old)")
    if not final.parent.is_dir():
        return []
    return sorted(p for p in final.parent.iterdir() if p.is_dir() and pattern.fullmatch(p.name))
