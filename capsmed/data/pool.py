"""Per-file preprocessing work spread over processes, results back in order to one writer.

Every source reader follows the same shape: a picklable job per raw file, a
module-level function that turns a job into arrays, and one :class:`DatasetWriter` in
the parent that appends results as they arrive (in job order, so output is
deterministic for a seed whatever the number of workers).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any, TypeVar

from capsmed.data.resume import ResultCache
from capsmed.progress import track

log = logging.getLogger(__name__)

J = TypeVar("J")
R = TypeVar("R")

MAX_DEFAULT_WORKERS = 8
AHEAD_PER_WORKER = 4  # jobs in flight per worker: keeps workers busy, bounds memory


def default_workers(requested: int | None = None) -> int:
    """``requested`` if set (> 0), else one worker per CPU, up to 8."""
    if requested:
        return max(1, int(requested))
    return min(os.cpu_count() or 1, MAX_DEFAULT_WORKERS)


def map_in_workers(fn: Callable[[J], R], jobs: Iterable[J], *, workers: int | None = None,
                   description: str = "files", disable_progress: bool | None = None,
                   cache: ResultCache | None = None, key: Callable[[J], str] | None = None,
                   result_type: type | None = None) -> Iterator[tuple[J, R]]:
    """Yield ``(job, fn(job))`` in job order, computed in ``workers`` spawned processes.

    ``fn`` must be a module-level function and jobs picklable. With one worker or one
    job the work runs inline (no process start-up cost). A rich progress bar counts
    jobs; the pool is shut down (pending jobs cancelled) if the consumer stops early
    or raises. At most ``AHEAD_PER_WORKER`` jobs per worker are in flight, so finished
    results never pile up in memory when the writer is the slower side.

    With a :class:`~capsmed.data.resume.ResultCache` (plus ``key`` naming each job and
    the ``result_type`` dataclass), finished results are stored as they arrive and a
    rerun computes only the jobs that are missing.
    """
    jobs = list(jobs)
    if cache is not None:
        assert key is not None and result_type is not None
        yield from _cached(fn, jobs, cache, key, result_type, workers=workers,
                           description=description, disable_progress=disable_progress)
        return
    n = min(default_workers(workers), len(jobs))
    pool = ProcessPoolExecutor(n, mp_context=get_context("spawn")) if n > 1 else None
    try:
        results = _bounded_map(pool, fn, jobs, n * AHEAD_PER_WORKER) if pool \
            else map(fn, jobs)
        yield from track(zip(jobs, results, strict=True), description, total=len(jobs),
                         disable=disable_progress)
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)


def _bounded_map(pool: ProcessPoolExecutor, fn: Callable[[J], R], jobs: list[J],
                 ahead: int) -> Iterator[R]:
    pending: deque[Future[R]] = deque()
    for job in jobs:
        pending.append(pool.submit(fn, job))
        if len(pending) >= ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _cached(fn: Callable[[J], R], jobs: list[J], cache: ResultCache, key: Callable[[J], str],
            result_type: type, **options: Any) -> Iterator[tuple[J, R]]:
    stored = [cache.get(key(job), result_type) for job in jobs]
    todo = [job for job, res in zip(jobs, stored, strict=True) if res is None]
    if len(todo) < len(jobs):
        log.info("resuming: %d of %d jobs were finished by an earlier run (%s)",
                 len(jobs) - len(todo), len(jobs), cache.dir)
    fresh = map_in_workers(fn, todo, **options)
    for job, res in zip(jobs, stored, strict=True):
        if res is None:
            _, res = next(fresh)
            cache.put(key(job), res)
        yield job, res
