"""The Slurm executor: each work item is a Slurm job, submitted through submitit.

Items that ask for the same resources and wait for the same jobs go out as one job
array. A job runs its task (:mod:`capsmed.pipeline.tasks`), the same code the local
executor runs, so it reads from the files what is left to do. Order between items is
Slurm's: ``--dependency=afterok:...``, and a job whose dependency failed is cancelled
(``--kill-on-invalid-dep=yes``) rather than left pending for ever.

Time limits: Slurm warns a job ``signal_lead_s`` seconds before its limit (SIGUSR2 to
every process of the job, up to a minute early). The training saves its exact state
at its next step (mid-epoch) and exits; then :meth:`SlurmJob.checkpoint` requeues the
job, which resumes from that state. There is no cap on how often a job is requeued
while it makes progress; a job that makes none in three time windows in a row, or a
task that keeps no progress (a data stage, an analysis), is not requeued and fails
with the reason.
Preemption (``scontrol requeue``, a preempting job) sends SIGTERM: the training saves
the same way and Slurm runs the job again.

How a job ended is what it wrote in ``.capsmed-run/slurm/notes/`` when it could, else
``sacct``'s state (timeout, preempted, out of memory, node failure, cancelled, exit
code). One ``squeue`` (and one ``sacct`` for the jobs that left the queue) answers a
:meth:`SlurmExecutor.poll` of any number of jobs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from capsmed.errors import CapsmedError
from capsmed.io import write_text_atomic
from capsmed.pipeline.execute import INTERRUPTED_REASON
from capsmed.pipeline.executors.base import ExecutorSettings
from capsmed.pipeline.executors.slurm_queue import sacct, squeue
from capsmed.pipeline.resources import Resources
from capsmed.pipeline.work import FAILED, FINISHED, QUEUED, RUNNING, Job, JobState, WorkItem

DEFAULT_TIME_MIN = 1440
STALLED_WINDOWS = 3  # time windows in a row without progress before a job gives up
RUNNING_STATES = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "CONFIGURING"}
ENDED = {"TIMEOUT": "time limit reached", "PREEMPTED": "preempted",
         "OUT_OF_MEMORY": "out of memory", "NODE_FAIL": "node failure",
         "BOOT_FAIL": "node failed to boot", "DEADLINE": "deadline reached",
         "CANCELLED": "cancelled", "FAILED": "failed", "REVOKED": "revoked"}


def default_signal_lead(time_min: int) -> int:
    """Seconds between Slurm's warning and the limit: 2 minutes, or a quarter of a
    short limit (at least 10 s)."""
    return max(10, min(120, time_min * 60 // 4))


def signal_lead_problem(lead: int, time_min: int) -> str | None:
    """Why ``lead`` does not fit a ``time_min`` limit, or None. The warning must leave
    the job half of its window to work and come early enough to save (10 s)."""
    if lead < 10:
        return f"signal_lead_s {lead} leaves no time to save the state (at least 10 s)"
    if lead > time_min * 60 // 2:
        return (f"signal_lead_s {lead} does not fit a {time_min} min time limit: the "
                f"warning would come before the job works (at most {time_min * 30} s)")
    return None


class SlurmJob:
    """What one Slurm job runs: a task, requeued at its time limit while it progresses
    (picklable; submitit calls it, and :meth:`checkpoint` on the warning).

    Slurm may send its warning up to a minute early (its timers tick every ~30 s), so
    the warning only starts the end of the window: the task's training works on until
    ``SAVE_SECONDS`` before the job's real limit (a training that already took the
    warning stops and saves at its next step by itself), then it is told to stop
    (SIGTERM: it saves at its next step) and the job is requeued."""

    SAVE_SECONDS = 15.0

    def __init__(self, task: Any, notes: Path, lead: int, time_min: int) -> None:
        self.task, self.notes, self.lead, self.time_min = task, Path(notes), lead, time_min
        self.stalled = 0
        self.last: object = None  # the task's progress at the last time limit
        self._ends = 0.0  # when Slurm ends this job (Unix time)

    def __call__(self) -> str:
        import signal
        import time

        # the limit counts from the job's start, before this process's start-up (which
        # can take a minute on a cluster's shared file system): Slurm says when it ends
        self._ends = _job_end_time() or time.time() + self.time_min * 60
        placement = _placement()
        if self.last is None:
            self.last = self.task.progress()
        reason = self.task(placement)
        # the work is over: a warning now (Slurm's can come early) must not kill this
        # process while it exits, which Slurm would take for a failure
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        stopped = reason is not None and reason.startswith(INTERRUPTED_REASON)
        if placement.rank == 0 and not stopped:  # stopped: Slurm says why (requeue, ...)
            self._note("finished" if reason is None else "failed", reason)
        if reason is not None:
            raise RuntimeError(reason)
        return "done"

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Slurm's warning before the time limit: let the training work until just
        before the limit and save its state, then requeue this job if that state moved
        since the last time limit."""
        import signal
        import time

        import submitit

        from capsmed.pipeline.processes import signal_children, wait_for_children

        left = self._ends - time.time() - self.SAVE_SECONDS
        wait_for_children(max(1.0, left))
        signal_children(signal.SIGTERM)  # a training saves at its next step
        wait_for_children(self.SAVE_SECONDS - 5.0)
        now = self.task.progress()
        if now is None:
            return self._give_up("time limit reached; a " + self.task.kind + " cannot "
                                 "continue where it stopped: give it a longer "
                                 "resources.time_min")
        self.stalled = self.stalled + 1 if now == self.last else 0
        self.last = now
        if self.stalled >= STALLED_WINDOWS:
            return self._give_up(f"no progress in {STALLED_WINDOWS} time windows in a row: "
                                 "the time limit is too short for the job to start and "
                                 "train one step; raise resources.time_min")
        return submitit.helpers.DelayedSubmission(self)

    def _give_up(self, reason: str) -> None:
        self._note("failed", reason)
        return None

    def _note(self, outcome: str, reason: str | None) -> None:
        write_text_atomic(self.notes / f"{_job_id()}.json",
                          json.dumps({"outcome": outcome, "reason": reason}))


def _job_id() -> str:
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "0")


def _job_end_time() -> float | None:
    """When this job's time limit ends, as Unix time (``squeue``'s EndTime, printed in
    this node's local time); None where Slurm cannot say."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job or shutil.which("squeue") is None:
        return None
    try:
        proc = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True,
                              text=True, timeout=30)
        return datetime.fromisoformat(proc.stdout.split()[0]).timestamp()
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None  # no squeue answer, or an end that is not a time (N/A, Unknown)


def _placement() -> Any:
    """This task's place in its job: with several tasks, the torch.distributed
    variables (env:// rendezvous on the first node) for its training process."""
    from capsmed.pipeline.work import Placement

    world = int(os.environ.get("SLURM_NTASKS", "1"))
    if world <= 1:
        return Placement()
    import submitit

    job = submitit.JobEnvironment()
    port = 20000 + int(str(job.job_id).split("_")[0]) % 40000
    env = {"MASTER_ADDR": job.hostnames[0], "MASTER_PORT": str(port),
           "RANK": str(job.global_rank), "WORLD_SIZE": str(world),
           "LOCAL_RANK": str(job.local_rank),
           "LOCAL_WORLD_SIZE": str(world // max(1, job.num_nodes))}
    return Placement(env=env, rank=job.global_rank, world=world)


class SlurmExecutor:
    """Submits work items as Slurm jobs (see the module's docstring)."""

    name: ClassVar[str] = "slurm"
    OPTIONS: ClassVar[frozenset[str]] = frozenset({"signal_lead_s", "poll_s"})
    detached: ClassVar[bool] = True

    def __init__(self, settings: ExecutorSettings) -> None:
        self.settings = settings
        self.folder = settings.records / "slurm"
        self.notes = self.folder / "notes"
        self.refresh_seconds = float(settings.options.get("poll_s", 10))
        self._array_size: int | None = None  # the cluster's MaxArraySize, once asked

    def gpus_available(self) -> int | None:
        return None

    def check(self, items: Sequence[WorkItem]) -> None:
        """No submitit, no sbatch, or a warning that does not fit a time limit."""
        try:
            import submitit  # noqa: F401
        except ImportError as exc:
            raise CapsmedError("--executor slurm needs submitit: pip install "
                               "'capsmed[slurm]'") from exc
        if shutil.which("sbatch") is None:
            raise CapsmedError("--executor slurm: no sbatch on PATH (is this a Slurm login "
                               "node?); use --executor local")
        for item in items:
            time_min = item.resources.time_min or DEFAULT_TIME_MIN
            problem = signal_lead_problem(self._lead(time_min), time_min)
            if problem:
                raise CapsmedError(f"executor.slurm: {problem} ({item.label})")

    def _lead(self, time_min: int) -> int:
        lead = self.settings.options.get("signal_lead_s")
        return int(lead) if lead is not None else default_signal_lead(time_min)

    def submit(self, items: Sequence[WorkItem], placed: Mapping[str, Job]) -> list[Job]:
        """All of ``items`` or none: a group sbatch refuses (a cluster limit, a bad
        partition) cancels the jobs this call submitted before it, which no ledger
        would name (a rerun would submit their work twice)."""
        known, jobs, chunk = dict(placed), [], list(items)
        try:
            for group in _groups(items):
                for chunk in _chunks(group, self._max_array_size()):
                    submitted = self._submit_group(chunk, known)
                    for item, job in zip(chunk, submitted, strict=True):
                        known[item.key] = job
                        jobs.append(job)
        except BaseException as exc:
            self.cancel(jobs)
            from submitit.core.utils import FailedJobError

            if isinstance(exc, FailedJobError):
                lines = str(exc).strip().splitlines() or ["no message"]
                raise CapsmedError(
                    f"sbatch refused {len(chunk)} job(s) ({chunk[0].label}"
                    f"{', ...' if len(chunk) > 1 else ''}): "
                    f"{lines[-1]}" + (f"; cancelled the {len(jobs)} job(s) submitted "
                                      "before them" if jobs else "")) from exc
            raise
        return jobs

    def _max_array_size(self) -> int:
        """The cluster's MaxArraySize (a job array's indices are below it): a group
        of more runs goes out as several arrays (Slurm's default: 1001)."""
        if self._array_size is None:
            self._array_size = 1001
            try:
                proc = subprocess.run(["scontrol", "show", "config"], capture_output=True,
                                      text=True, timeout=60)
                for line in proc.stdout.splitlines():
                    name, _, value = line.partition("=")
                    if name.strip() == "MaxArraySize" and value.strip().isdigit():
                        self._array_size = max(1, int(value.strip()))
            except (OSError, subprocess.TimeoutExpired):
                pass
        return self._array_size

    def _submit_group(self, group: list[WorkItem], known: Mapping[str, Job]) -> list[Job]:
        import submitit

        res = group[0].resources
        after = sorted({known[k].job_id for item in group for k in item.after if k in known})
        executor = submitit.SlurmExecutor(folder=str(self.folder / "%j"),
                                          max_num_timeout=10 ** 6)
        executor.update_parameters(**self._parameters(res, after))
        lead = self._lead(res.time_min or DEFAULT_TIME_MIN)
        with executor.batch():
            handles = [executor.submit(SlurmJob(item.task, self.notes, lead,
                                                res.time_min or DEFAULT_TIME_MIN))
                       for item in group]
        jobs = [Job(item.key, self.name, str(h.job_id))
                for item, h in zip(group, handles, strict=True)]
        for job in jobs:  # Slurm's ids start over (a new cluster, MaxJobId): a note of
            # an older job of this id is not this one's (it writes its own at its end)
            (self.notes / f"{job.job_id}.json").unlink(missing_ok=True)
        return jobs

    def _parameters(self, res: Resources, after: list[str]) -> dict[str, Any]:
        time_min = res.time_min or DEFAULT_TIME_MIN
        nodes = res.nodes
        params: dict[str, Any] = {
            "job_name": f"capsmed-{self.settings.study}", "time": time_min, "nodes": nodes,
            "ntasks_per_node": res.processes // nodes, "signal_delay_s": self._lead(time_min),
            "array_parallelism": self.settings.jobs or 256}
        if res.gpus:
            params["gpus_per_node"] = res.gpus // nodes
        if res.cpus:
            params["cpus_per_task"] = res.cpus
        if res.mem_gb:
            params["mem"] = f"{int(res.mem_gb * 1024)}MB"
        for key in ("partition", "account", "qos", "constraint"):
            if getattr(res, key):
                params[key] = getattr(res, key)
        extra: dict[str, Any] = {k: (True if v == "" else v) for k, v in res.sbatch}
        if after:
            extra["dependency"] = "afterok:" + ":".join(after)
            extra["kill_on_invalid_dep"] = "yes"
        if extra:
            params["additional_parameters"] = extra
        return params

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobState]:
        if not jobs:
            return {}
        queue = squeue()
        out, gone = {}, []
        for job in jobs:
            if job.job_id in queue:
                state, reason = queue[job.job_id]
                out[job.job_id] = JobState(RUNNING if state in RUNNING_STATES else QUEUED,
                                           None if reason in ("None", "") else reason)
            else:
                gone.append(job.job_id)
        accounted = sacct(gone) if gone else {}
        for job_id in gone:
            out[job_id] = self._ended(job_id, accounted.get(job_id))
        return out

    def _ended(self, job_id: str, accounted: tuple[str, str] | None) -> JobState:
        try:
            note = json.loads((self.notes / f"{job_id}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            note = None
        if note and note.get("outcome") == "finished":
            return JobState(FINISHED)
        if note and note.get("reason"):
            return JobState(FAILED, str(note["reason"]))
        if accounted is None:  # e.g. an array task cancelled before it ever started
            return JobState(FAILED, "left Slurm's queue without an accounting record "
                            "(cancelled before it started, or no sacct here); see "
                            f"{self.folder}")
        state, exit_code = accounted
        word = state.split()[0]
        if word == "COMPLETED":
            return JobState(FINISHED)
        if word in ("PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "REQUEUE_HOLD"):
            return JobState(RUNNING if word == "RUNNING" else QUEUED)  # left squeue just now
        why = ENDED.get(word, word.lower())
        if word == "FAILED":
            code, _, signal = exit_code.partition(":")
            why = (f"killed by signal {signal}" if signal not in ("", "0")
                   else f"exit code {code}")
        elif word == "CANCELLED" and " by " in state:
            why = f"cancelled by uid {state.split(' by ')[1]}"
        return JobState(FAILED, f"Slurm: {why}")

    def cancel(self, jobs: Sequence[Job]) -> None:
        ids = [j.job_id for j in jobs]
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=60)

    def close(self, interrupted: bool = False) -> None:
        """Jobs go on in Slurm (a rerun or ``capsmed run wait`` re-attaches to them)."""


def _groups(items: Sequence[WorkItem]) -> list[list[WorkItem]]:
    """Runs of consecutive items with equal resources and dependencies: one array each
    (an item that waits for one in the same batch starts a new group)."""
    groups: list[list[WorkItem]] = []
    for item in items:
        last = groups[-1] if groups else None
        same = (last is not None and last[0].resources == item.resources
                and last[0].after == item.after
                and not set(item.after) & {i.key for i in last})
        if same:
            last.append(item)
        else:
            groups.append([item])
    return groups


def _chunks(group: list[WorkItem], size: int) -> list[list[WorkItem]]:
    return [group[i:i + size] for i in range(0, len(group), size)]
