"""The units an executor runs: a work item (what to do, with what, after what) and
the handle and state of the job that does it.

A pipeline becomes a batch of :class:`WorkItem`: one per data stage to make, per run
to train or evaluate, per analysis to run. Each carries a :class:`Task`, a picklable
callable that does the work in the same way wherever it runs (a thread of the local
executor, a Slurm job), reading from the files what is left to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from capsmed.pipeline.resources import Resources

# The states a job can be in, as every executor reports them.
QUEUED, RUNNING, FINISHED, FAILED = "queued", "running", "finished", "failed"
LIVE = (QUEUED, RUNNING)


@dataclass(frozen=True)
class Placement:
    """Where a task runs.

    ``env``: variables for the processes it starts (``CUDA_VISIBLE_DEVICES``,
    ``OMP_NUM_THREADS``, the torch.distributed ones under a multi-task Slurm job).
    ``processes``: how many training processes the task starts itself on this machine
    (the local executor gives a multi-GPU run its GPUs and lets it launch one process
    per GPU); 1 where the scheduler started one task per process and ``rank`` says
    which of the ``world`` this is. ``persistent``: a run's train and evaluate
    commands may run in a long-lived worker process of this executor
    (:mod:`capsmed.pipeline.workers`) instead of a fresh process each.
    """

    env: Mapping[str, str] = field(default_factory=dict)
    processes: int = 1
    rank: int = 0
    world: int = 1
    persistent: bool = False


class Task(Protocol):
    """What a work item does; picklable (a Slurm job unpickles it on a compute node)."""

    kind: str  # "stage", "run" or "analysis"

    def __call__(self, placement: Placement) -> str | None:
        """Do the work; returns None, or why it failed (one line)."""

    def progress(self) -> object:
        """A token that changes whenever the task makes lasting progress (None: it keeps
        none, so a job stopped before its end must start over)."""


@dataclass(frozen=True)
class WorkItem:
    """One job to submit: ``key`` is unique in the study (``run:LABEL``,
    ``stage:NAME``, ``analysis:NAME``) and ``after`` names the keys it waits for."""

    key: str
    label: str
    task: Task
    resources: Resources
    after: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return self.task.kind


@dataclass(frozen=True)
class Job:
    """A submitted item: which executor holds it, under which id."""

    key: str
    executor: str
    job_id: str


@dataclass(frozen=True)
class JobState:
    """Where a job stands: :data:`QUEUED`, :data:`RUNNING`, :data:`FINISHED` or
    :data:`FAILED` with a one-line ``reason`` (a scheduler's: timeout, out of memory,
    cancelled, ...; or the task's own)."""

    state: str
    reason: str | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE
