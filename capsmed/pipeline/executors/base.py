"""What an executor is: a small protocol the runner drives, whatever runs the jobs.

The runner hands an executor a batch of :class:`~capsmed.pipeline.work.WorkItem` (each
with its resources and the items it waits for), records the :class:`Job` handles it
gets back in the study's ledger, asks :meth:`Executor.poll` about all of them at once
on each refresh, and cancels what must not run. Every executor is built from the same
:class:`ExecutorSettings`; an executor's own options come from the pipeline's
``executor.<name>:`` section and are named in its ``OPTIONS``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from capsmed.pipeline.work import Job, JobState, WorkItem


@dataclass(frozen=True)
class ExecutorSettings:
    """The arguments of every executor.

    ``jobs``: at most this many jobs at once (None: the executor's default); Slurm's
    applies to each job array apart (its ``%N``), so several arrays run more.
    ``devices``: the GPUs of this machine the user gave (``--gpus``), None for all
    that are visible; only an executor that runs jobs here reads it.
    ``options``: the pipeline's ``executor.<name>`` section (checked against OPTIONS).
    """

    out: Path
    study: str
    jobs: int | None = None
    devices: tuple[str, ...] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def records(self) -> Path:
        return Path(self.out) / ".capsmed-run"


@runtime_checkable
class Executor(Protocol):
    """Runs work items somewhere; the runner knows it only through these methods."""

    name: ClassVar[str]
    OPTIONS: ClassVar[frozenset[str]]  # the keys of its executor.<name> section
    detached: ClassVar[bool]  # its jobs go on after this process ends (--detach)
    settings: ExecutorSettings
    refresh_seconds: float  # between two polls while the runner waits

    def __init__(self, settings: ExecutorSettings) -> None: ...

    def check(self, items: Sequence[WorkItem]) -> None:
        """Refuse (CapsmedError, one line) what it cannot run, before anything runs."""

    def gpus_available(self) -> int | None:
        """GPUs a job can get here at most; None where the executor cannot know (a
        cluster: its partitions decide)."""

    def submit(self, items: Sequence[WorkItem], placed: Mapping[str, Job]) -> list[Job]:
        """Submit ``items`` (in order, dependencies first); ``placed`` holds the live
        jobs of keys they wait for that were submitted earlier."""

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobState]:
        """The state of each job, by job id, from one query of the scheduler."""

    def cancel(self, jobs: Sequence[Job]) -> None:
        """Stop these jobs (queued ones never start)."""

    def close(self, interrupted: bool = False) -> None:
        """The runner is done: start nothing more. ``interrupted`` (Ctrl-C, SIGTERM):
        jobs that end with the runner are told to stop (a training saves its state
        first) and waited for; jobs that outlive it (Slurm's) go on."""
