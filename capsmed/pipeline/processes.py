"""Child processes of a pipeline's jobs: capsmed commands with their output in a log.

Each piece of work is a ``capsmed`` command in a child process whose output goes to a
log file, so a failing run never takes the runner down and every executor runs the
same commands. Children get SIGTERM if the thread that started them dies (Linux
``PR_SET_PDEATHSIG``): a runner killed with SIGKILL leaves no orphan training behind,
and the orphan's SIGTERM makes it save ``resume.pt``, so the next runner resumes it.

The children of this process are tracked, so that a job told to stop (Slurm's warning
before a time limit) can wait until its training has saved its state, and a runner
stopped with SIGTERM can pass the signal on.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_children: dict[int, subprocess.Popen] = {}
_lock = threading.Lock()

# Every child (and its children) carries the pid of the runner that started it: a
# runner killed with SIGKILL leaves its lock behind, and its children work on after it
# (PR_SET_PDEATHSIG's SIGTERM makes a training finish its step and save first), so the
# next runner takes the folder over only once none of them is left (orphans_of).
RUNNER_VARIABLE = "CAPSMED_RUNNER_PID"


def capsmed_argv(*args: str, processes: int = 1) -> list[str]:
    """The same capsmed as this process, as a command line; ``processes`` > 1 starts
    that many data-parallel copies through torch.distributed's launcher (torchrun)."""
    if processes > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={processes}", "-m", "capsmed", *args]
    return [sys.executable, "-m", "capsmed", *args]


def die_with_parent() -> None:  # runs in the child between fork and exec
    # not Linux (no libc.so.6): children outlive a killed runner, as with any other tool
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    # Slurm's warning before a time limit (SIGUSR2) reaches every process of a job, and
    # its default action kills: ignored until the training installs its own handler
    # (which saves at the next step), it cannot kill a child that is still starting.
    if hasattr(signal, "SIGUSR2"):
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def run_logged(argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> int:
    """Run ``argv`` with stdout and stderr appended to ``log``; returns the exit code."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"\n$ {shlex.join(argv)}\n")  # a path with a space stays one argument
        fh.flush()
        proc = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT,
                                env=child_env(env),
                                preexec_fn=die_with_parent if os.name == "posix" else None)
        track(proc)
        try:
            # short waits, never one blocking wait: a signal handler of this process
            # (a Slurm job's) may then reap the child itself (wait_for_children)
            while proc.returncode is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.5)
        finally:
            untrack(proc)
    return proc.returncode


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: this one's, ``env``, unbuffered output and
    :data:`RUNNER_VARIABLE`."""
    return {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1",
            RUNNER_VARIABLE: str(os.getpid())}


def orphans_of(pid: int) -> list[int]:
    """The live processes of this user that runner ``pid`` started (directly or not),
    found by their :data:`RUNNER_VARIABLE`; none where ``/proc`` cannot say (not Linux)."""
    marker = f"{RUNNER_VARIABLE}={pid}".encode()
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                with open(os.path.join(entry.path, "environ"), "rb") as fh:
                    variables = fh.read().split(b"\0")
            except OSError:  # gone meanwhile, or another user's
                continue
            if marker in variables:
                found.append(int(entry.name))
    return sorted(found)


def track(proc: subprocess.Popen) -> None:
    """Count ``proc`` among the children that signals are passed on to."""
    with _lock:
        _children[proc.pid] = proc


def untrack(proc: subprocess.Popen) -> None:
    with _lock:
        _children.pop(proc.pid, None)


def signal_children(signum: int) -> None:
    """Send ``signum`` to every child process this process started."""
    with _lock:
        pids = list(_children)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def wait_for_children(timeout: float) -> bool:
    """Wait until every child has exited (True) or ``timeout`` seconds pass (False).

    Safe inside a signal handler that interrupted :func:`run_logged`: children are
    reaped with non-blocking ``waitpid`` calls, and their exit codes kept."""
    deadline = time.monotonic() + timeout
    while True:
        with _lock:
            procs = [p for p in _children.values() if p.returncode is None]
        for proc in procs:
            try:
                pid, status = os.waitpid(proc.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = proc.pid, 0
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
        if all(p.returncode is not None for p in procs):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
