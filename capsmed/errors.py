"""The exceptions users see: a one-line message naming the file and the problem.

Exit codes (README "Errors and exit codes"): a :class:`CapsmedError` exits 1, an
:class:`Interrupted` (Ctrl-C, SIGTERM, a stopped training run) exits 130, the shell's
code for SIGINT; both print one ``error: <message>`` line.
"""

import shlex


class CapsmedError(Exception):
    """A problem with the user's input or environment, reported as one line.

    The CLI prints ``error: <message>`` and exits with :attr:`exit_code`; library
    callers can catch it. Messages name the offending file first, e.g.
    ``"data/x.h5: not an HDF5 file"``.
    """

    exit_code = 1


class Interrupted(CapsmedError):
    """Stopped on request (Ctrl-C, SIGTERM), not by bad input: exit code 130."""

    exit_code = 130


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, for a one-line error naming a library's
    reason (torch's and h5py's run to several lines; ``KeyError`` quotes its text)."""
    text = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def shell_quoted(path: object) -> str:
    """``path`` as one word of a command a message suggests pasting into a shell
    ("evaluate it with: capsmed evaluate RUN"): quoted when it holds a space or another
    character the shell reads, left as it is otherwise."""
    return shlex.quote(str(path))
