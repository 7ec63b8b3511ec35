"""Follow a batch of work items through an executor until every one has ended.

One :meth:`Executor.poll` per refresh answers for all live jobs. A job that starts is
shown; one that ends is checked against the files (a run is done only when its folder
says so); one that failed is submitted again up to ``retries`` times, together with
the items waiting for it (their old jobs would wait for ever, or were cancelled). An
item whose dependency failed for good is cancelled and reported as such, never run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from capsmed.pipeline.executors.base import Executor
from capsmed.pipeline.work import FAILED, FINISHED, RUNNING, Job, JobState, WorkItem

log = logging.getLogger(__name__)

# (item, its job's final state) -> None when its work is done, else why not
Outcome = Callable[[WorkItem, JobState], str | None]
# (what: running / done / failed, item, detail)
Event = Callable[[str, WorkItem, str | None], None]
# (item, job) -> None: a job was submitted (the ledger records it)
Submitted = Callable[[WorkItem, Job], None]
# (job, state) -> None: a job ended (the ledger records it)
Ended = Callable[[Job, JobState], None]


@dataclass
class Tracked:
    item: WorkItem
    job: Job | None = None
    attempts: int = 0
    running: bool = False
    reason: str | None = None  # set once it failed for good
    done: bool = False

    @property
    def ended(self) -> bool:
        return self.done or self.reason is not None


class Driver:
    """Submits ``items`` (or attaches to their live ``jobs``) and waits for them."""

    def __init__(self, executor: Executor, items: Sequence[WorkItem], retries: int,
                 outcome: Outcome, event: Event, submitted: Submitted | None = None,
                 ended: Ended | None = None) -> None:
        self.executor, self.retries = executor, retries
        self.outcome, self.event = outcome, event
        self.submitted = submitted or (lambda item, job: None)
        self.ended = ended or (lambda job, state: None)
        self.tracked = {item.key: Tracked(item) for item in items}

    def start(self, live: Mapping[str, Job] | None = None) -> list[Job]:
        """Attach to ``live`` jobs (key -> job, from the ledger), submit the rest."""
        for key, job in (live or {}).items():
            if key in self.tracked:
                self.tracked[key].job = job
        todo = [t.item for t in self.tracked.values() if t.job is None]
        return self._submit(todo)

    def _submit(self, items: Sequence[WorkItem]) -> list[Job]:
        if not items:
            return []
        placed = {k: t.job for k, t in self.tracked.items() if t.job is not None}
        jobs = self.executor.submit(items, placed)
        for item, job in zip(items, jobs, strict=True):
            tracked = self.tracked[item.key]
            tracked.job, tracked.running, tracked.attempts = job, False, tracked.attempts + 1
            self.submitted(item, job)
        return jobs

    def wait(self, refresh: float | None = None) -> dict[str, str]:
        """Until every item has ended; returns the failures, item key -> reason."""
        pause = refresh if refresh is not None else getattr(self.executor,
                                                           "refresh_seconds", 2.0)
        while True:
            self.refresh()
            if all(t.ended for t in self.tracked.values()):
                break
            time.sleep(pause)
        return {k: t.reason for k, t in self.tracked.items() if t.reason is not None}

    def refresh(self) -> None:
        """One poll of every live job, and what follows from the answers."""
        live = [t for t in self.tracked.values() if not t.ended and t.job is not None]
        states = self.executor.poll([t.job for t in live])
        for tracked in live:
            job = tracked.job
            state = states.get(job.job_id)
            if state is None or tracked.job is not job or tracked.ended:
                continue  # resubmitted or settled earlier in this refresh
            if state.state == RUNNING and not tracked.running:
                tracked.running = True
                self.event("running", tracked.item, self._detail(tracked))
            elif state.state in (FINISHED, FAILED):
                self._ended(tracked, state)

    def _detail(self, tracked: Tracked) -> str | None:
        parts = [] if self.executor.name == "local" else [
            f"{self.executor.name} job {tracked.job.job_id}"]
        if tracked.attempts > 1:
            parts.append(f"attempt {tracked.attempts}")
        return ", ".join(parts) or None

    def _ended(self, tracked: Tracked, state: JobState) -> None:
        self.ended(tracked.job, state)
        reason = self.outcome(tracked.item, state)
        if reason is None:
            tracked.done = True
            self.event("done", tracked.item, None)
            return
        failed_dep = self._failed_dependency(tracked.item)
        if failed_dep is not None:
            self._give_up(tracked, f"needs {failed_dep}, which failed")
        elif tracked.attempts <= self.retries:
            log.info("%s failed (%s); submitting it again", tracked.item.label, reason)
            dependents = self._dependents(tracked.item.key)
            self.executor.cancel([t.job for t in dependents if t.job is not None])
            self._submit([tracked.item, *(t.item for t in dependents)])
            for t in dependents:
                t.attempts -= 1  # not their failure
        else:
            self._give_up(tracked, reason)

    def _give_up(self, tracked: Tracked, reason: str) -> None:
        tracked.reason = reason
        self.event("failed", tracked.item, reason)
        dependents = self._dependents(tracked.item.key)
        self.executor.cancel([t.job for t in dependents if t.job is not None])
        for t in dependents:
            t.reason = f"needs {tracked.item.label}, which failed"
            if t.job is not None:
                self.ended(t.job, JobState(FAILED, t.reason))
            self.event("failed", t.item, t.reason)

    def _failed_dependency(self, item: WorkItem) -> str | None:
        for key in item.after:
            other = self.tracked.get(key)
            if other is not None and other.reason is not None:
                return other.item.label
        return None

    def _dependents(self, key: str) -> list[Tracked]:
        """Items not ended that wait for ``key``, directly or through others, in order."""
        found: dict[str, Tracked] = {}
        frontier = {key}
        while frontier:
            nxt = {t.item.key for t in self.tracked.values() if not t.ended
                   and t.item.key not in found and set(t.item.after) & frontier}
            found.update({k: self.tracked[k] for k in nxt})
            frontier = nxt
        return [t for t in self.tracked.values() if t.item.key in found]
