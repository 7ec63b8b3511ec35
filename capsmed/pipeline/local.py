"""The local executor: N runs at once on this machine, one per GPU when there are GPUs.

Each concurrent run owns a slot: a GPU (``CUDA_VISIBLE_DEVICES``) or, on a CPU-only
machine, an equal share of the cores (``OMP_NUM_THREADS``), so concurrent runs do not
fight over the same threads.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from capsmed.pipeline.execute import execute_run
from capsmed.pipeline.spec import RunSpec
from capsmed.pipeline.state import PipelineState

Event = Callable[[str, RunSpec, str, str | None], None]  # (what, run, run_id, detail)


def slot_environments(jobs: int, gpus: Sequence[str]) -> list[dict[str, str]]:
    """One environment per concurrent run (an OMP_NUM_THREADS the user set is kept)."""
    if gpus:
        return [{"CUDA_VISIBLE_DEVICES": str(g)} for g in gpus]
    if "OMP_NUM_THREADS" in os.environ:
        return [{} for _ in range(jobs)]
    threads = str(max(1, (os.cpu_count() or 1) // max(1, jobs)))
    return [{"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads} for _ in range(jobs)]


def run_with_retries(state: PipelineState, run: RunSpec, run_id: str, env: dict[str, str],
                     retries: int, event: Event, stopping: threading.Event) -> str | None:
    """Up to ``1 + retries`` attempts; the outcome is recorded for ``capsmed run status``."""
    reason: str | None = "not started"
    attempts = int(state.read_record(run_id).get("attempts", 0))
    for attempt in range(retries + 1):
        if stopping.is_set():
            return "interrupted before it finished"
        event("running", run, run_id, None if attempt == 0 else f"attempt {attempt + 1}")
        reason = execute_run(state, run, run_id, env)
        attempts += 1
        state.write_record(run_id, label=run.label, fields=run.fields, attempts=attempts,
                           outcome="done" if reason is None else "failed", reason=reason,
                           log=str(state.log_path(run, run_id)))
        if reason is None:
            event("done", run, run_id, None)
            return None
        if stopping.is_set():
            break
    event("failed", run, run_id, reason)
    return reason


def run_local(state: PipelineState, todo: Sequence[tuple[RunSpec, str]], jobs: int,
              gpus: Sequence[str], retries: int, event: Event) -> dict[str, str]:
    """Run ``todo`` with ``jobs`` at once (``len(gpus)`` when GPUs are given); returns
    the failures, run id -> reason. Ctrl-C lets the running trainings save their state
    (they get the signal too) and starts nothing new."""
    slots: queue.Queue[dict[str, str]] = queue.Queue()
    envs = slot_environments(jobs, gpus)
    for env in envs:
        slots.put(env)
    stopping = threading.Event()

    def work(run: RunSpec, run_id: str) -> str | None:
        env = slots.get()
        try:
            return run_with_retries(state, run, run_id, env, retries, event, stopping)
        finally:
            slots.put(env)

    failures: dict[str, str] = {}
    pool = ThreadPoolExecutor(max_workers=len(envs))
    futures = {pool.submit(work, run, run_id): run_id for run, run_id in todo}
    try:
        for future, run_id in futures.items():
            reason = future.result()
            if reason is not None:
                failures[run_id] = reason
    except KeyboardInterrupt:
        stopping.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return failures
