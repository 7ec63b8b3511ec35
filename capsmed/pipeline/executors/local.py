"""The local executor: jobs run on this machine, as many at once as it has room for.

Room is ``jobs`` at once (one per GPU by default, 1 on a CPU-only machine) and the GPUs:
a job that asks for N GPUs gets N of them (``CUDA_VISIBLE_DEVICES``) and trains in one
process per GPU. ``executor: {local: {runs_per_gpu: K}}`` (``--runs-per-gpu``) lets K
jobs share each GPU, for small runs that leave it idle between launches; a job is placed
on the GPUs with the fewest jobs, and never twice on one. On a CPU-only machine the
cores are shared out between the concurrent jobs (``OMP_NUM_THREADS``). A job starts
once the jobs it waits for have finished, in the order it was submitted. Jobs are
threads of the runner, each running its task's capsmed commands as child processes, so
they end with the runner: the ledger then shows them as ended with it, and the next
``capsmed run`` resumes them.
A run's train and evaluate commands go to a long-lived worker process per slot
(:mod:`capsmed.pipeline.workers`), which saves a fresh Python's start-up per command;
``executor: {local: {worker: false}}`` gives every command a fresh process.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from capsmed.errors import CapsmedError
from capsmed.pipeline.executors.base import ExecutorSettings
from capsmed.pipeline.processes import signal_children
from capsmed.pipeline.work import (
    FAILED,
    FINISHED,
    QUEUED,
    RUNNING,
    Job,
    JobState,
    Placement,
    WorkItem,
)
from capsmed.pipeline.workers import close_workers, prewarm_workers
from capsmed.processes import pid_alive

log = logging.getLogger(__name__)


def visible_gpus() -> list[str]:
    """CUDA devices of this machine (none on a CPU-only one)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # CUDA stops at an invalid entry: -1 (none), 0,-1,1 (GPU 0)
        ids = [g.strip() for g in visible.split(",") if g.strip()]
        return list(itertools.takewhile(lambda g: not g.startswith("-"), ids))
    if sys.platform == "linux" and not any(
            os.path.exists(p) for p in ("/proc/driver/nvidia/gpus", "/dev/kfd")):
        return []  # no NVIDIA or ROCm driver: no GPU, and no 2 s import of torch to say so
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


@dataclass
class _Entry:
    item: WorkItem
    job_id: str
    after: tuple[str, ...]  # job ids
    devices: list[str] = field(default_factory=list)
    cancelled: bool = False


class LocalExecutor:
    """Runs jobs in threads of this process (see the module's docstring)."""

    name: ClassVar[str] = "local"
    OPTIONS: ClassVar[frozenset[str]] = frozenset({"worker", "runs_per_gpu"})
    detached: ClassVar[bool] = False
    refresh_seconds: ClassVar[float] = 0.2  # a poll reads memory only

    def __init__(self, settings: ExecutorSettings) -> None:
        self.settings = settings
        self._devices: list[str] | None = None
        self._used: dict[str, int] | None = None  # jobs on each GPU
        self._busy = 0
        self._queue: list[_Entry] = []
        self._states: dict[str, JobState] = {}
        self._cond = threading.Condition()
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._ids = itertools.count(1)
        self._host = socket.gethostname()
        self._dispatcher: threading.Thread | None = None
        self._markers = settings.records / "local"
        worker = settings.options.get("worker", True)
        if not isinstance(worker, bool):
            raise CapsmedError(f"executor.local.worker: expected true or false, got "
                               f"{worker!r}")
        self._persistent = worker
        share = settings.options.get("runs_per_gpu", 1)
        if isinstance(share, bool) or not isinstance(share, int) or share < 1:
            raise CapsmedError(f"executor.local.runs_per_gpu: expected a whole number >= 1, "
                               f"got {share!r}")
        self.runs_per_gpu = share

    @property
    def devices(self) -> list[str]:
        """The GPUs jobs may use (asked of CUDA on first use: importing torch is slow)."""
        if self._devices is None:
            self._devices = (list(self.settings.devices) if self.settings.devices is not None
                             else visible_gpus())
            self._used = dict.fromkeys(self._devices, 0)
            if self.runs_per_gpu > 1 and not self._devices:
                log.info("executor.local.runs_per_gpu: %d, but there is no GPU here; "
                         "jobs run %d at once on the CPU", self.runs_per_gpu, self.jobs)
        return self._devices

    @property
    def jobs(self) -> int:
        return self.settings.jobs or max(1, len(self.devices) * self.runs_per_gpu)

    # -- the protocol ----------------------------------------------------------------------
    def gpus_available(self) -> int | None:
        return len(self.devices)

    def check(self, items: Sequence[WorkItem]) -> None:
        for item in items:
            res = item.resources
            if res.nodes > 1:
                raise CapsmedError(f"{item.label}: asks for {res.nodes} nodes; the local "
                                   "executor runs on this machine only (--executor slurm)")
            if (res.gpus or 0) > len(self.devices):
                raise CapsmedError(f"{item.label}: asks for {res.gpus} GPU(s), and this "
                                   f"machine gives {len(self.devices)} "
                                   f"({self._device_note()})")

    def submit(self, items: Sequence[WorkItem], placed: Mapping[str, Job]) -> list[Job]:
        jobs, known = [], dict(placed)
        with self._cond:
            for item in items:
                job = Job(item.key, self.name, f"{self._host}:{os.getpid()}:{next(self._ids)}")
                after = tuple(known[k].job_id for k in item.after if k in known)
                self._queue.append(_Entry(item, job.job_id, after))
                self._states[job.job_id] = JobState(QUEUED)
                known[item.key] = job
                jobs.append(job)
            self._cond.notify_all()
        if self._dispatcher is None:
            self._dispatcher = threading.Thread(target=self._dispatch, daemon=True,
                                                name="capsmed-local-dispatch")
            self._dispatcher.start()
        return jobs

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobState]:
        with self._cond:
            return {j.job_id: self._states.get(j.job_id) or self._foreign(j) for j in jobs}

    def cancel(self, jobs: Sequence[Job]) -> None:
        ids = {j.job_id for j in jobs}
        with self._cond:
            for entry in self._queue:
                if entry.job_id in ids:
                    entry.cancelled = True
                    self._states[entry.job_id] = JobState(FAILED, "cancelled")
            self._cond.notify_all()

    def close(self, interrupted: bool = False) -> None:
        """Start nothing more; wait for the jobs that run. ``interrupted``: their
        processes get SIGTERM first (a Ctrl-C reached them already; a SIGTERM sent to
        the runner alone did not), so a training saves its state and stops."""
        with self._cond:
            self._closing = True
            for entry in self._queue:
                entry.cancelled = True
            self._cond.notify_all()
        if interrupted:
            signal_children(signal.SIGTERM)
        for thread in list(self._threads):
            thread.join()
        close_workers()

    # -- inside ----------------------------------------------------------------------------
    def _device_note(self) -> str:
        if self.settings.devices is not None:
            return f"--gpus {','.join(self.settings.devices) or 'none'}"
        return "CUDA sees " + (f"{len(self.devices)}" if self.devices else "none")

    def _foreign(self, job: Job) -> JobState:
        """A job of another runner (from the ledger): alive while that runner is."""
        host, _, rest = job.job_id.partition(":")
        pid = int(rest.partition(":")[0] or 0)
        if host != self._host:
            return JobState(RUNNING)  # cannot be checked from here
        if pid != os.getpid() and pid_alive(pid):
            marker = self._markers / job.job_id.replace(":", "_")
            return JobState(RUNNING if marker.exists() else QUEUED)
        return JobState(FAILED, f"ended with its runner (pid {pid})")

    def _ready(self, entry: _Entry) -> bool | None:
        """True: its dependencies finished; None: one has not ended yet or failed (it
        waits, as a Slurm job does, until the runner cancels it)."""
        return all(self._states.get(d, JobState(FINISHED)).state == FINISHED
                   for d in entry.after) or None

    def _fits(self, entry: _Entry) -> bool:
        return self._busy < self.jobs and self._gpus_of(entry.item) <= len(self._open())

    def _open(self) -> list[str]:
        """The GPUs with room for one more job, the emptiest first (then the machine's
        order), so K jobs on K GPUs get one each before any GPU is shared."""
        self.devices  # noqa: B018 -- asks CUDA once, fills _used
        used = self._used or {}
        order = {d: i for i, d in enumerate(self.devices)}
        return sorted((d for d in self.devices if used[d] < self.runs_per_gpu),
                      key=lambda d: (used[d], order[d]))

    def _gpus_of(self, item: WorkItem) -> int:
        return item.resources.gpus or 0

    def _dispatch(self) -> None:
        with self._cond:
            while True:
                self._queue = [e for e in self._queue if not e.cancelled
                               and self._states[e.job_id].state == QUEUED]
                if self._closing and not self._queue:
                    return
                for entry in self._queue:
                    if not self._ready(entry):
                        continue
                    if not self._fits(entry):
                        break  # first come, first served
                    self._start(entry)
                self._cond.wait(timeout=1.0)

    def _start(self, entry: _Entry) -> None:
        want = self._gpus_of(entry.item)
        entry.devices = sorted(self._open()[:want], key=self.devices.index)
        for device in entry.devices:
            self._used[device] += 1  # type: ignore[index]  # _open filled it
        self._busy += 1
        self._states[entry.job_id] = JobState(RUNNING)
        thread = threading.Thread(target=self._work, args=(entry,), daemon=True,
                                  name=f"capsmed-{entry.item.key}")
        self._threads.append(thread)
        thread.start()

    def _placement(self, entry: _Entry) -> Placement:
        res = entry.item.resources
        return Placement(env=self._env(entry.devices, res.gpus, res.processes),
                         processes=res.processes, persistent=self._persistent)

    def _env(self, devices: Sequence[str], gpus: int | None, processes: int
             ) -> dict[str, str]:
        """The variables of a job given ``devices`` (its GPUs) that asked for ``gpus``."""
        env: dict[str, str] = {}
        if devices or gpus == 0 and self.devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        if not devices and "OMP_NUM_THREADS" not in os.environ:
            share = (os.cpu_count() or 1) // max(1, self.jobs) // processes
            threads = str(max(1, share))
            env.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
        return env

    def prewarm(self, runs: int) -> None:
        """Start the workers the first of ``runs`` runs will train in now, so that
        their imports (torch, training: seconds) overlap the runner's checks and the
        data stages. Workers never used are stopped at the end, unwaited."""
        if not self._persistent or runs < 1:
            return
        if self.devices:  # one per slot a run of one GPU gets, in the order it gets them
            slots = [d for _ in range(self.runs_per_gpu) for d in self.devices]
            first = slots[:min(self.jobs, runs)]
            for device in dict.fromkeys(first):
                prewarm_workers(self._env([device], 1, 1), first.count(device))
        else:
            prewarm_workers(self._env([], None, 1), min(self.jobs, runs))

    def _work(self, entry: _Entry) -> None:
        marker = self._markers / entry.job_id.replace(":", "_")
        with contextlib.suppress(OSError):
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        try:
            reason = entry.item.task(self._placement(entry))
        except CapsmedError as exc:  # a full disk, ...: its one line is the reason
            reason = str(exc)
        except Exception as exc:  # a bug in a task must not hang the runner
            log.exception("%s failed", entry.item.label)
            reason = f"{type(exc).__name__}: {exc}"
        finally:
            marker.unlink(missing_ok=True)
        with self._cond:
            for device in entry.devices:
                self._used[device] -= 1  # type: ignore[index]
            self._busy -= 1
            self._states[entry.job_id] = (JobState(FINISHED) if reason is None
                                          else JobState(FAILED, reason))
            self._cond.notify_all()
