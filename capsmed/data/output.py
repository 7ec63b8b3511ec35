"""The output file of a preprocessing run: checked before the work, owned while it runs.

:func:`claim_output` runs first in every ``preprocess_*`` function:

* an output that is a folder, or an existing file without ``overwrite``, is refused
  before any input is read (runs may point to the file; ``capsmed train`` and
  ``report`` refuse to clobber theirs too);
* a lock file ``.<name>.lock`` beside the output, held with ``flock`` for the whole
  run, says that this process writes it: a second run on the same output is refused,
  and since every writer holds the lock, temporaries ``.<name>.XXXXXXXX.tmp`` found
  while holding it belong to dead runs (``kill -9``, a power cut) and are removed.
  The kernel releases the lock when its process dies, however it dies;
* an interruption (Ctrl-C, or SIGTERM where the caller turns it into one) is
  recorded as well as raised: a ``KeyboardInterrupt`` raised inside a destructor or a
  weakref callback cannot propagate, Python prints it ("Exception ignored in ...")
  and the run would go on to exit 0. While the output is claimed such a swallowed
  interrupt is not printed, and :func:`raise_if_interrupted` raises it again at the
  next finished job and before the claim ends: one ``error: interrupted`` line, 130.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from capsmed.errors import CapsmedError
from capsmed.io import ensure_writable_dir, output_lock

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
_received: list[int] = []  # signals received while an output was claimed


def check_output(output: Path, overwrite: bool = False) -> Path:
    """Refuse an output that is a folder, or an existing file unless ``overwrite``."""
    output = Path(output)
    if output.is_dir():
        raise CapsmedError(f"{output}: is a folder; give the path of the .h5 file to write "
                           f"(e.g. {output / 'data.h5'})")
    if output.exists() and not overwrite:
        raise CapsmedError(f"{output}: already exists (runs may point to it); pass "
                           "--overwrite to replace it, or choose another -o")
    ensure_writable_dir(output.parent)
    return output


def stale_temporaries(output: Path) -> list[Path]:
    """Temporaries of ``output`` that :func:`capsmed.io.atomic_path` makes (mkstemp:
    ``.<name>.`` + 8 characters + ``.tmp``), and of nothing else."""
    pattern = re.compile(rf"\.{re.escape(output.name)}\.[A-Za-z0-9_]{{8}}\.tmp")
    return sorted(p for p in output.parent.iterdir() if pattern.fullmatch(p.name))


@contextlib.contextmanager
def _recording_interrupts() -> Iterator[None]:
    """Record SIGINT/SIGTERM before the handler in place (Python's or the CLI's) raises,
    and keep an interrupt that a destructor swallowed from being printed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def record(signum: int, frame: Any) -> None:
        _received.append(signum)
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:  # SIGTERM with no handler: die as before
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def unraisable(info: Any) -> None:
        if not (_received and isinstance(info.exc_value, KeyboardInterrupt)):
            hook(info)  # anything else is printed as before

    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if handler is not signal.SIG_IGN and handler is not None:
            previous[sig] = handler
            signal.signal(sig, record)
    hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield
    finally:
        sys.unraisablehook = hook
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def raise_if_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` again if a signal arrived while an output is claimed
    (in case the first one was swallowed by a destructor)."""
    if _received:
        signum = _received[-1]
        raise KeyboardInterrupt(*([] if signum == signal.SIGINT
                                  else [signal.Signals(signum).name]))


@contextlib.contextmanager
def claim_output(output: Path, overwrite: bool = False) -> Iterator[Path]:
    """Check ``output``, own it for the run, and remove its dead runs' temporaries.

    Raises:
        CapsmedError: the output is a folder, exists without ``overwrite``, cannot be
            written, or another process is writing it.
    """
    output = check_output(output, overwrite)
    with output_lock(output), _recording_interrupts():
        for stale in stale_temporaries(output):
            log.info("removing %s, left by a run that was killed", stale)
            stale.unlink(missing_ok=True)
        _received.clear()
        try:
            yield output
            raise_if_interrupted()
        finally:
            _received.clear()


def claims_output(preprocess: F) -> F:
    """Run ``preprocess`` inside :func:`claim_output` of its ``output`` argument, with
    its ``overwrite`` argument: the decorator of every ``preprocess_*`` function."""
    signature = inspect.signature(preprocess)
    assert {"output", "overwrite"} <= set(signature.parameters), preprocess.__name__

    @functools.wraps(preprocess)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        log.debug("%s(%s)", preprocess.__name__, ", ".join(
            f"{k}={v!r}" for k, v in bound.arguments.items() if k != "disable_progress"))
        with claim_output(Path(bound.arguments["output"]), bound.arguments["overwrite"]):
            return preprocess(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
