"""Per-file preprocessing work spread over processes, results back in order to one writer.

Every source reader follows the same shape: a picklable job per raw file, a
module-level function that turns a job into arrays, and one :class:`DatasetWriter` in
the parent that appends results as they arrive (in job order, so output is
deterministic for a seed whatever the number of workers).

Workers never outlive the run: each asks the kernel for SIGTERM when its parent dies
(``PR_SET_PDEATHSIG``; elsewhere a thread watches ``os.getppid()``), so a ``kill -9``
of the main process takes them along. A run that stops early (bad input, Ctrl-C)
cancels the queued jobs and lets each worker finish the job it holds (a few seconds at
most) before it exits; one still busy after :data:`STOP_GRACE_S` is terminated. Killing
a worker while it sends its result leaves half a message in the result pipe, and the
pool's manager thread then waits for the rest forever, so the process never exits
(Python < 3.14). Workers ignore SIGINT: a
Ctrl-C to the terminal's process group is the main process's to handle, with one
``error: interrupted`` line, not one traceback per worker.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from multiprocessing.connection import wait
from typing import Any, TypeVar

from capsmed.data.output import raise_if_interrupted
from capsmed.data.resume import ResultCache, input_digests
from capsmed.processes import pid_alive
from capsmed.progress import track

log = logging.getLogger(__name__)

J = TypeVar("J")
R = TypeVar("R")

MAX_DEFAULT_WORKERS = 8
AHEAD_PER_WORKER = 4  # jobs in flight per worker: keeps workers busy, bounds memory
STOP_GRACE_S = 60.0  # a stopping run waits this long for workers to finish their job
PR_SET_PDEATHSIG = 1  # linux/prctl.h
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def default_workers(requested: int | None = None) -> int:
    """``requested`` if set (> 0), else one worker per CPU, up to 8."""
    if requested:
        return max(1, int(requested))
    return min(os.cpu_count() or 1, MAX_DEFAULT_WORKERS)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _worker_init(main: int) -> None:
    """Runs first in every worker: die with the parent, leave Ctrl-C to it, and compute
    on one thread (two workers on two cores each running two BLAS or OpenCV threads
    were slower than one worker).

    A worker whose parent (the main process ``main``) died before the death signal
    was set up exits at once.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    else:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    # the signals were blocked while the parent started us (see _submit); unblocking
    # delivers a pending SIGTERM now, and a pending SIGINT is ignored
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    if os.getppid() == 1 or not pid_alive(main):  # a parent died before prctl took effect
        os._exit(1)
    _one_thread()


def _one_thread() -> None:
    """Limit BLAS / OpenMP and OpenCV to one thread in this process."""
    import cv2
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    cv2.setNumThreads(1)


def _submit(pool: ProcessPoolExecutor, fn: Callable[[J], R], job: J) -> Future[R]:
    """``pool.submit`` with SIGINT and SIGTERM blocked: a submit may start a worker,
    which inherits the mask, so a Ctrl-C during its start-up waits for _worker_init
    (and is ignored there) instead of printing a traceback from the worker. In this
    process the signal is only delayed until the mask is restored."""
    if threading.current_thread() is not threading.main_thread():
        return pool.submit(fn, job)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        return pool.submit(fn, job)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel what is queued and let the workers finish their current job and exit (the
    run is not finishing); terminate one still busy after ``STOP_GRACE_S``."""
    workers = list((getattr(pool, "_processes", None) or {}).values())  # pid -> Process
    manager = getattr(pool, "_executor_manager_thread", None)  # it reaps the workers
    pool.shutdown(wait=False, cancel_futures=True)
    # Exits are watched on the processes' sentinels, not with join()/is_alive(): the
    # pool's manager thread reaps the workers too, and a process it reaped first looks
    # alive forever to another thread's waitpid.
    running = {p.sentinel: p for p in workers}
    deadline = time.monotonic() + STOP_GRACE_S
    while running and time.monotonic() < deadline:
        for sentinel in wait(list(running), timeout=deadline - time.monotonic()):
            running.pop(sentinel)
    for process in running.values():  # a job that hangs: the pipe may be left half-written
        log.warning("worker %d still busy after %.0f s: terminated", process.pid,
                    STOP_GRACE_S)
        process.terminate()
    if running:
        wait(list(running), timeout=5)
    if manager is not None:
        manager.join(timeout=5)


def map_in_workers(fn: Callable[[J], R], jobs: Iterable[J], *, workers: int | None = None,
                   description: str = "files", disable_progress: bool | None = None,
                   cache: ResultCache | None = None, key: Callable[[J], str] | None = None,
                   result_type: type | None = None,
                   inputs: Callable[[J], Sequence[Any]] | None = None
                   ) -> Iterator[tuple[J, R]]:
    """Yield ``(job, fn(job))`` in job order, computed in ``workers`` processes.

    ``fn`` must be a module-level function and jobs picklable. With one worker or one
    job the work runs inline (no process start-up cost). A rich progress bar counts
    jobs. If the consumer stops early or raises (bad input, Ctrl-C), queued jobs are
    cancelled and the workers terminated at once. At most ``AHEAD_PER_WORKER`` jobs per
    worker are in flight, so finished results never pile up in memory when the writer
    is the slower side. An interrupt that a destructor swallowed is raised again after
    the next result (:func:`capsmed.data.output.raise_if_interrupted`).

    With a :class:`~capsmed.data.resume.ResultCache` (plus ``key`` naming each job and
    what it carries, and the ``result_type`` dataclass), finished results are stored as
    they arrive and a rerun computes only the jobs that are missing. ``inputs`` (a
    module-level function) lists the files a job reads; a stored result is reused only
    while their contents are those it was computed from.
    """
    jobs = list(jobs)
    if cache is not None:
        assert key is not None and result_type is not None
        yield from _cached(fn, jobs, cache, key, result_type, inputs, workers=workers,
                           description=description, disable_progress=disable_progress)
        return
    n = min(default_workers(workers), len(jobs))
    pool = ProcessPoolExecutor(n, mp_context=get_context("spawn"), initializer=_worker_init,
                               initargs=(os.getpid(),)) if n > 1 else None
    finished = False
    try:
        results = _bounded_map(pool, fn, jobs, n * AHEAD_PER_WORKER) if pool \
            else map(fn, jobs)
        for item in track(zip(jobs, results, strict=True), description, total=len(jobs),
                          disable=disable_progress):
            raise_if_interrupted()
            yield item
        finished = True
    finally:
        if pool and finished:
            pool.shutdown()
        elif pool:
            _stop(pool)


def _bounded_map(pool: ProcessPoolExecutor, fn: Callable[[J], R], jobs: list[J],
                 ahead: int) -> Iterator[R]:
    pending: deque[Future[R]] = deque()
    for job in jobs:
        pending.append(_submit(pool, fn, job))
        if len(pending) >= ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _no_inputs(job: Any) -> list[Any]:
    return []


def _read_and_run(fn: Callable[[J], R], inputs: Callable[[J], Sequence[Any]], job: J
                  ) -> tuple[dict[str, str], R]:
    """The digests of the job's input files, taken before it reads them, and its result
    (runs in a worker, where the files are read anyway)."""
    return input_digests(inputs(job)), fn(job)


def _cached(fn: Callable[[J], R], jobs: list[J], cache: ResultCache, key: Callable[[J], str],
            result_type: type, inputs: Callable[[J], Sequence[Any]] | None,
            **options: Any) -> Iterator[tuple[J, R]]:
    inputs = inputs or _no_inputs
    stored = [cache.get(key(job), result_type, inputs(job)) for job in jobs]
    todo = [job for job, res in zip(jobs, stored, strict=True) if res is None]
    if len(todo) < len(jobs):
        log.info("resuming: %d of %d jobs were finished by an earlier run (%s)",
                 len(jobs) - len(todo), len(jobs), cache.dir)
    fresh = map_in_workers(functools.partial(_read_and_run, fn, inputs), todo, **options)
    try:
        for job, res in zip(jobs, stored, strict=True):
            if res is None:
                _, (digests, res) = next(fresh)
                cache.put(key(job), res, digests)
            yield job, res
    finally:
        fresh.close()  # stops its workers now when the consumer stops early
