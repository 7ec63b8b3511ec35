"""The Slurm executor: one job per run, submitted as a job array through submitit.

Each job calls :func:`capsmed.pipeline.execute.execute_run`, the same code the local
executor runs, so a job reads from the run directory what is left to do. Before its
time limit, Slurm signals the job (SIGUSR2, as submitit asks). The training child
saves ``resume.pt`` on that signal, and submitit requeues the job through
:meth:`RunJob.checkpoint`; a preempted job is requeued the same way. Without
slurmdbd, ``sacct`` is unavailable and submitit's job states can be wrong, so the
runner never asks the scheduler how a run ended: it waits until the job has left
``squeue``, then reads the outcome from the run directory.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from capsmed.errors import CapsmedError
from capsmed.pipeline.execute import execute_run
from capsmed.pipeline.spec import RunSpec
from capsmed.pipeline.state import PipelineState

POLL_SECONDS = 2.0
SETTINGS = {"partition": "slurm_partition", "time_min": "timeout_min",
            "gpus": "gpus_per_node", "cpus_per_task": "cpus_per_task", "mem_gb": "mem_gb",
            "array_parallelism": "slurm_array_parallelism"}
Event = Callable[[str, RunSpec, str, str | None], None]


class RunJob:
    """What one Slurm job does: train and evaluate one run (picklable)."""

    def __init__(self, out: Path, run: RunSpec, run_id: str) -> None:
        self.out, self.run, self.run_id = Path(out), run, run_id

    def __call__(self) -> str:
        reason = execute_run(PipelineState(self.out), self.run, self.run_id)
        if reason is not None:
            raise RuntimeError(reason)
        return "done"

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Called by submitit on preemption or before the time limit: requeue this job
        (the training has saved resume.pt on the same signal)."""
        import submitit

        return submitit.helpers.DelayedSubmission(self)


def require_slurm(settings: Mapping[str, Any]) -> None:
    """Refuse before anything runs: no submitit, no sbatch, or unknown settings."""
    try:
        import submitit  # noqa: F401
    except ImportError as exc:
        raise CapsmedError("--executor slurm needs submitit: pip install 'capsmed[slurm]'"
                           ) from exc
    if shutil.which("sbatch") is None:
        raise CapsmedError("--executor slurm: no sbatch on PATH (is this a Slurm login "
                           "node?); use --executor local")
    unknown = sorted(set(settings) - set(SETTINGS) - {"account", "additional"})
    if unknown:
        raise CapsmedError(f"executor.slurm: unknown setting(s) {', '.join(unknown)} "
                           f"(known: {', '.join([*SETTINGS, 'account', 'additional'])})")


def make_executor(state: PipelineState, settings: Mapping[str, Any], name: str) -> Any:
    """A submitit executor with the pipeline's Slurm settings."""
    import submitit

    require_slurm(settings)
    folder = state.records / "slurm" / "%j"
    executor = submitit.AutoExecutor(folder=str(folder), cluster="slurm")
    params: dict[str, Any] = {"name": f"capsmed-{name}", "timeout_min": 1440}
    params.update({SETTINGS[k]: v for k, v in settings.items() if k in SETTINGS and v})
    extra = dict(settings.get("additional") or {})
    if settings.get("account"):
        extra["account"] = settings["account"]
    if extra:
        params["slurm_additional_parameters"] = extra
    executor.update_parameters(**params)
    return executor


def queued_jobs() -> set[str]:
    """Job ids Slurm still holds (pending, running, requeued), arrays expanded."""
    proc = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        raise CapsmedError(f"squeue failed: {proc.stderr.strip()[:200]}")
    return {line.strip() for line in proc.stdout.splitlines() if line.strip()}


def run_slurm(state: PipelineState, todo: Sequence[tuple[RunSpec, str]],
              settings: Mapping[str, Any], retries: int, event: Event, name: str
              ) -> dict[str, str]:
    """Submit ``todo`` as a job array, wait, resubmit failures ``retries`` times;
    returns the failures, run id -> reason."""
    executor = make_executor(state, settings, name)
    remaining = list(todo)
    failures: dict[str, str] = {}
    for attempt in range(retries + 1):
        with executor.batch():
            jobs = [(run, run_id, executor.submit(RunJob(state.out, run, run_id)))
                    for run, run_id in remaining]
        for run, run_id, job in jobs:
            event("running", run, run_id, f"slurm job {job.job_id}" + (
                f", attempt {attempt + 1}" if attempt else ""))
            state.write_record(run_id, label=run.label, fields=run.fields,
                               slurm_job=job.job_id)
        waiting = {str(job.job_id): (run, run_id) for run, run_id, job in jobs}
        remaining = []
        while waiting:
            time.sleep(POLL_SECONDS)
            for job_id in sorted(set(waiting) - queued_jobs()):
                run, run_id = waiting.pop(job_id)
                record = state.read_record(run_id)
                done = state.status(run, run_id) == "done"
                state.write_record(run_id, attempts=int(record.get("attempts", 0)) + 1,
                                   outcome="done" if done else "failed",
                                   log=str(state.log_path(run, run_id)),
                                   slurm_log=str(state.records / "slurm" / job_id))
                if done:
                    event("done", run, run_id, None)
                    failures.pop(run_id, None)
                else:
                    why = f"slurm job {job_id} ended without finishing; see " \
                          f"{state.log_path(run, run_id)} and {state.records / 'slurm'}"
                    failures[run_id] = why
                    remaining.append((run, run_id))
        if not remaining:
            break
    for run, run_id in remaining:
        event("failed", run, run_id, failures[run_id])
    return failures
