"""Long-lived worker processes that train and evaluate run after run.

A run's ``capsmed train`` and ``capsmed evaluate`` would each start a fresh Python
that imports torch and capsmed again: about 3.5 CPU-seconds per process, most of a
toy study's wall time and hours of an idle GPU over a paper's 432 runs. The local
executor hands them instead to a worker (:mod:`capsmed.cli.worker`) kept for the
slot's environment (its GPUs and thread counts), which runs one command at a time,
exactly as a fresh process would.

A worker is still a child process: a crash or an out-of-memory kill ends only it (the
command fails with its exit code, the next one gets a fresh worker), Ctrl-C and the
runner's SIGTERM reach it as they reach any child (:func:`signal_children`), and it
dies with the runner (``PR_SET_PDEATHSIG``; started from one long-lived thread,
since the signal follows the thread that started the child). A worker is retired
after :data:`MAX_COMMANDS` commands, and after a command it could not finish. A
benchmark (:data:`FRESH_COMMANDS`) gets a worker of its own: it measures its process.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from capsmed.pipeline import processes

MAX_COMMANDS = 64  # then a fresh process: whatever a long run of commands leaks ends


# The commands that train or read a network: their worker imports torch, training and
# evaluation while it waits for its first command (a data stage's commands do not).
TORCH_COMMANDS = frozenset({"train", "evaluate", "analyze", "predict", "export", "bench"})
# Measured: a first training in a worker that had imported only torch took 2.5 s, the
# next 0.9 s; the rest was these (torch._dynamo: the optimiser's first step; typer's
# adapters: pydantic, for option parsing).
PRELOAD = ("torch", "torch._dynamo", "typer._adapters", "capsmed.train.run",
           "capsmed.train.engine", "capsmed.train.loop", "capsmed.evaluate.evaluation")
# The commands that measure the process they run in: ``bench`` reports its peak memory
# (on a CPU the peak of the whole process's life, which nothing resets), so in a worker
# it reported an earlier command's. Each runs in a worker of its own.
FRESH_COMMANDS = frozenset({"bench"})


def command_name(args: Sequence[str]) -> str:
    """The sub-command of ``capsmed ARGS`` (``-q``, ``-v`` may come before it)."""
    return next((a for a in args if not a.startswith("-")), "")


class Worker:
    """One worker process; runs one command at a time. ``preload``: it imports
    :data:`PRELOAD` as soon as it starts."""

    def __init__(self, env: Mapping[str, str], preload: bool = False) -> None:
        self.key = pool_key(env, preload)
        self.commands = 0
        req_r, self._requests = os.pipe()
        self._replies, rep_w = os.pipe()
        argv = [sys.executable, "-m", "capsmed.cli.worker",
                "--requests", str(req_r), "--replies", str(rep_w)]
        argv += ["--preload", ",".join(PRELOAD)] if preload else []
        try:
            self.proc = _spawn(lambda: subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, pass_fds=(req_r, rep_w),
                env=processes.child_env(env),
                preexec_fn=processes.die_with_parent if os.name == "posix" else None))
        finally:
            os.close(req_r)
            os.close(rep_w)
        self._pending = b""

    def run(self, args: Sequence[str], log: Path) -> int:
        """Run ``capsmed ARGS`` in the worker, its output appended to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"\n$ {shlex.join(processes.capsmed_argv(*args))}\n")
        self.commands += 1
        request = json.dumps({"args": list(args), "log": str(log)}) + "\n"
        processes.track(self.proc)  # Ctrl-C, SIGTERM and Slurm's signals reach it
        try:
            os.write(self._requests, request.encode())
            return self._reply()
        except BrokenPipeError:  # it died while idle
            return self._ended()
        finally:
            processes.untrack(self.proc)

    def _reply(self) -> int:
        # short waits, as processes.run_logged: a signal handler of this thread may run
        while b"\n" not in self._pending:
            ready, _, _ = select.select([self._replies], [], [], 0.5)
            if ready:
                chunk = os.read(self._replies, 4096)
                if not chunk:
                    return self._ended()
                self._pending += chunk
            elif self.proc.poll() is not None:
                return self._ended()
        line, _, self._pending = self._pending.partition(b"\n")
        return int(json.loads(line)["code"])

    def _ended(self) -> int:
        """The worker died during its command: that is the command's exit code."""
        self.proc.wait()
        return self.proc.returncode if self.proc.returncode != 0 else 1

    @property
    def usable(self) -> bool:
        return self.proc.poll() is None and self.commands < MAX_COMMANDS

    def end_requests(self) -> None:
        """No more commands: the worker exits once it has read this."""
        for fd in (self._requests, self._replies):
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self, timeout: float = 10.0) -> None:
        """End of requests, and wait until the worker has exited (killed if it does not
        in ``timeout``)."""
        self.end_requests()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def pool_key(env: Mapping[str, str], preload: bool = False) -> tuple:
    return (tuple(sorted(env.items())), preload)


class WorkerPool:
    """Idle workers by environment and preload; a command takes one (or starts one)
    and gives it back when it has ended."""

    def __init__(self) -> None:
        self._idle: dict[tuple, list[Worker]] = {}
        self._ending: list[Worker] = []
        self._lock = threading.Lock()

    def run(self, args: Sequence[str], log: Path, env: Mapping[str, str]) -> int:
        name = command_name(args)
        fresh = name in FRESH_COMMANDS
        worker = Worker(env) if fresh else self._take(env, preload=name in TORCH_COMMANDS)
        code = worker.run(args, log)
        if code in (0, 1) and worker.usable and not fresh:  # ended on its own: reused
            self._give_back(worker)
        else:  # killed, interrupted, crashed, a benchmark's: a fresh one for the next
            worker.close(timeout=2.0)
        return code

    def prewarm(self, env: Mapping[str, str], count: int = 1) -> None:
        """Start ``count`` workers that preload torch for ``env`` now (while the
        runner and the data stages work), unless that many are idle already."""
        with self._lock:
            missing = count - len(self._idle.get(pool_key(env, True), []))
        for _ in range(missing):
            self._give_back(Worker(env, preload=True))

    def _give_back(self, worker: Worker) -> None:
        with self._lock:
            self._idle.setdefault(worker.key, []).append(worker)

    def _take(self, env: Mapping[str, str], preload: bool) -> Worker:
        with self._lock:
            idle = self._idle.get(pool_key(env, preload), [])
            while idle:
                worker = idle.pop(0)  # the oldest: prewarmed first
                if worker.usable:
                    return worker
                worker.end_requests()
                self._ending.append(worker)
        return Worker(env, preload)

    def close(self, wait: bool = True) -> None:
        """Tell every idle worker to exit; ``wait``: until they (and those told
        before) have."""
        with self._lock:
            workers = [w for ws in self._idle.values() for w in ws]
            self._idle.clear()
            self._ending += workers
            ending = list(self._ending) if wait else []
            if wait:
                self._ending.clear()
        for worker in workers:
            worker.end_requests()
            if worker.commands == 0:  # prewarmed, never used: it may still be importing
                with contextlib.suppress(OSError):
                    worker.proc.terminate()
        for worker in ending:
            worker.close()


_pool = WorkerPool()


def run_in_worker(args: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> int:
    """Run ``capsmed ARGS`` in a worker of this process's pool; its exit code."""
    return _pool.run(args, log, dict(env or {}))


def prewarm_workers(env: Mapping[str, str], count: int = 1) -> None:
    """Have ``count`` workers for training commands in ``env`` start now."""
    _pool.prewarm(dict(env), count)


def close_workers(wait: bool = True) -> None:
    """Let every idle worker exit (the runner is done with them); ``wait`` for it."""
    _pool.close(wait)


# -- starting processes from one long-lived thread ---------------------------------------
_requests: queue.Queue = queue.Queue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def _spawn(start: Callable[[], subprocess.Popen]) -> subprocess.Popen:
    """``start()`` called in a thread that lives as long as this process: a child's
    death signal fires when the thread that started it ends, and an executor's job
    threads end after each job."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = threading.Thread(target=_spawn_loop, daemon=True,
                                        name="capsmed-worker-spawner")
            _spawner.start()
    answer: queue.Queue = queue.Queue(maxsize=1)
    _requests.put((start, answer))
    ok, value = answer.get()
    if not ok:
        raise value
    return value


def _spawn_loop() -> None:
    while True:
        start, answer = _requests.get()
        try:
            answer.put((True, start()))
        except BaseException as exc:  # handed to the caller's thread
            answer.put((False, exc))
