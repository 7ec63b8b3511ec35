"""Per-file preprocessing work spread over processes, results back in order to one writer.

Every source reader follows the same shape: a picklable job per raw file, a
module-level function that turns a job into arrays, and one :class:`DatasetWriter` in
the parent that appends results as they arrive (in job order, so output is
deterministic for a seed whatever the number of workers).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import TypeVar

from capsmed.progress import track

J = TypeVar("J")
R = TypeVar("R")

MAX_DEFAULT_WORKERS = 8


def default_workers(requested: int | None = None) -> int:
    """``requested`` if set (> 0), else one worker per CPU, up to 8."""
    if requested:
        return max(1, int(requested))
    return min(os.cpu_count() or 1, MAX_DEFAULT_WORKERS)


def map_in_workers(fn: Callable[[J], R], jobs: Iterable[J], *, workers: int | None = None,
                   description: str = "files", disable_progress: bool | None = None
                   ) -> Iterator[tuple[J, R]]:
    """Yield ``(job, fn(job))`` in job order, computed in ``workers`` spawned processes.

    ``fn`` must be a module-level function and jobs picklable. With one worker or one
    job the work runs inline (no process start-up cost). A rich progress bar counts
    jobs; the pool is shut down (pending jobs cancelled) if the consumer stops early
    or raises.
    """
    jobs = list(jobs)
    n = default_workers(workers)
    pool = (ProcessPoolExecutor(min(n, len(jobs)), mp_context=get_context("spawn"))
            if n > 1 and len(jobs) > 1 else None)
    try:
        results = pool.map(fn, jobs) if pool else map(fn, jobs)
        yield from track(zip(jobs, results, strict=True), description, total=len(jobs),
                         disable=disable_progress)
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
