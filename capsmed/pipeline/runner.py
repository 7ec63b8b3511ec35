"""``capsmed run PIPELINE.yaml``: data stages, the training grid, analyses, the report.

Order of work: check that every raw input exists (before anything runs), give every
run whose data exists its identity and skip the finished ones, then hand the rest to
the executor as one batch of work items: the data stages to make, the runs to train
or evaluate (each after its data stage) and the analyses (each after its runs). The
runner knows executors only through :class:`~capsmed.pipeline.executors.Executor`;
:class:`~capsmed.pipeline.drive.Driver` follows the jobs with retries. At the end it
writes the study's tables (ours beside the paper's numbers) and ``capsmed report``. A
failed run never stops the others; they are listed at the end with their logs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from capsmed.bundled import bundled_pipelines
from capsmed.errors import CapsmedError, shell_quoted
from capsmed.pipeline.checks import parse_selection
from capsmed.pipeline.display import RunBoard
from capsmed.pipeline.execute import current_identity, remade_outputs, stage_done
from capsmed.pipeline.executors import ExecutorSettings, create_executor
from capsmed.pipeline.executors.base import Executor
from capsmed.pipeline.follow import follow, ledger_executor, write_report
from capsmed.pipeline.items import work_items
from capsmed.pipeline.preflight import (
    MissingInputs,
    check_commands,
    check_grid,
    check_options,
    missing_inputs,
)
from capsmed.pipeline.spec import Pipeline, RunSpec, Stage
from capsmed.pipeline.state import PipelineState
from capsmed.pipeline.status import jobs_now, run_rows
from capsmed.pipeline.work import WorkItem
from capsmed.pipeline.workers import close_workers

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """How to run a pipeline (``capsmed run`` flags; the YAML's ``executor`` section
    gives the defaults)."""

    only: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    retries: int = 1
    executor: str | None = None
    jobs: int | None = None
    gpus: list[str] | None = None
    runs_per_gpu: int | None = None  # --runs-per-gpu (local executor)
    resources: dict[str, Any] = field(default_factory=dict)  # --slurm-* overrides
    allow_cpu: bool = False
    detach: bool = False
    report: bool = True


def select_runs(pipeline: Pipeline, only: Sequence[str], exclude: Sequence[str]
                ) -> list[RunSpec]:
    """The grid after ``--only`` / ``--exclude`` (FIELD=VALUE[,FIELD=VALUE]).

    ``--only``: every named field must have one of the values given for it (repeat a
    field to allow several values). ``--exclude``: each occurrence drops the runs that
    match all of its pairs (``condition=noaug,dataset=mnist``).
    """
    keep = parse_selection(list(only), "--only")
    drops = [parse_selection([item], "--exclude") for item in exclude]
    fields = {k for r in pipeline.runs for k in r.fields}
    unknown = sorted((set(keep) | {k for d in drops for k in d}) - fields)
    if unknown:
        raise CapsmedError(f"{pipeline.path}: --only/--exclude: unknown field(s) "
                           f"{', '.join(unknown)} (the grid has: {', '.join(sorted(fields))})")
    for option, selection in [("--only", keep), *(("--exclude", d) for d in drops)]:
        for key, wanted in selection.items():  # a misspelt value would keep or drop nothing
            values = list(dict.fromkeys(str(r.fields.get(key)) for r in pipeline.runs))
            bad = sorted(wanted - set(values))
            if bad:
                raise CapsmedError(f"{pipeline.path}: {option}: {key} has no value "
                                   f"{', '.join(bad)} on the grid (its values: "
                                   f"{', '.join(values)})")
    return [r for r in pipeline.runs
            if r.matches(keep) and not any(r.matches(d) for d in drops)]


def needed_stages(pipeline: Pipeline, runs: Sequence[RunSpec]) -> list[Stage]:
    """The data stages whose outputs the runs (or the analyses) read."""
    paths = {str(r.train.get("data")) for r in runs}
    paths |= {str(e.data) for r in runs for e in r.evaluations if e.data}
    words = {w for a in pipeline.analyses for w in a.command}
    return [s for s in pipeline.stages.values()
            if str(s.output) in paths or (runs and any(str(s.output) in w for w in words))]


def check_inputs(pipeline: Pipeline, stages: Sequence[Stage], state: PipelineState) -> None:
    """Fail at once, naming every missing raw input (a line each) and what makes it."""
    missing = missing_inputs(stages, lambda stage: stage_done(state, stage))
    if missing:
        raise MissingInputs([f"{pipeline.path}: {line}" for line in missing] + [
            f"{pipeline.path}: {len(missing)} missing input(s); make them, or point the "
            "pipeline elsewhere: --set data_root=DIR"])


def plan(pipeline: Pipeline, runs: Sequence[RunSpec], state: PipelineState
         ) -> list[tuple[RunSpec, str | None, str]]:
    """Each run with its identity (None until its data exists) and its status:
    ``outdated`` when a data stage it reads will be made again (changed commands), so
    its finished folder, if any, no longer counts."""
    remade = remade_outputs(pipeline, state)
    out: list[tuple[RunSpec, str | None, str]] = []
    owner: dict[str, str] = {}
    for run in runs:
        run_id = current_identity(run, remade)
        if run_id is None:
            outdated = str(run.train.get("data")) in remade
            out.append((run, None, "outdated" if outdated else "pending"))
            continue
        other = owner.setdefault(run_id, run.label)
        if other != run.label:  # the same options on two data files of equal content
            raise CapsmedError(f"{pipeline.path}: runs {other} and {run.label} have one "
                               f"identity ({run_id}): same options, data of the same "
                               "content; drop one of them")
        out.append((run, run_id, state.status(run, run_id)))
    return out


def executor_for(pipeline: Pipeline, options: RunOptions) -> Executor:
    """The executor ``--executor`` (else the YAML's ``executor.kind``) names, built
    with the same settings whatever it is."""
    cfg = pipeline.executor
    kind = options.executor or cfg.get("kind", "local")
    # an empty list is no GPU, as --gpus '' is; all visible is the key left out (or null)
    gpus = (_gpu_list(options.gpus, "--gpus") if options.gpus is not None else
            _gpu_list(cfg["gpus"], f"{pipeline.path}: executor.gpus")
            if cfg.get("gpus") is not None else None)
    jobs = cfg.get("jobs")
    if isinstance(jobs, str) and jobs.strip().isdigit():  # a {variable} given as text
        jobs = int(jobs)
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise CapsmedError(f"{pipeline.path}: executor.jobs must be a whole number >= 1, "
                           f"got '{jobs}'")
    jobs = options.jobs or jobs
    settings = dict(cfg.get(kind) or {})
    if options.runs_per_gpu is not None:
        if kind != "local":
            raise CapsmedError(f"--runs-per-gpu is for the local executor, not {kind} "
                               "(a cluster shares GPUs its own way, e.g. Slurm's shards)")
        settings["runs_per_gpu"] = options.runs_per_gpu
    return create_executor(kind, ExecutorSettings(
        out=pipeline.out, study=pipeline.name, jobs=jobs,
        devices=tuple(gpus) if gpus is not None else None, options=settings))


def _gpu_list(value: Any, where: str) -> list[str]:
    """GPU numbers (``--gpus 0,1``, ``executor.gpus: [0, 1]``), each once: a GPU named
    twice would be given twice to a run of several GPUs, and counted twice."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or isinstance(value, bool):
        raise CapsmedError(f"{where}: expected a list of GPU numbers such as [0, 1] "
                           f"(how many a run gets is resources.gpus), got '{value}'")
    devices = [str(g).strip() for g in items]
    if any(isinstance(g, bool) or not d.isdigit() for g, d in zip(items, devices,
                                                                    strict=True)):
        raise CapsmedError(f"{where}: expected GPU numbers such as 0,1, got '{value}'")
    devices = [str(int(d)) for d in devices]  # 00 is GPU 0
    twice = sorted({d for d in devices if devices.count(d) > 1})
    if twice:
        raise CapsmedError(f"{where}: GPU {', '.join(twice)} named more than once "
                           f"('{','.join(devices)}')")
    return devices


def check_gpus(pipeline: Pipeline, runs: Sequence[RunSpec], options: RunOptions,
               executor: Executor) -> None:
    """Refuse runs that ask for GPUs and would get none, unless ``--allow-cpu``."""
    wanting = [r for r in runs if (r.resources.get("gpus") or 0) > 0]
    if not wanting or options.allow_cpu:
        return
    asked = max(int(r.resources["gpus"]) for r in wanting)
    here = executor.gpus_available()
    if options.resources.get("gpus") == 0:
        why = "--slurm-gpus 0"
    elif here is not None and here < asked:
        why = (f"--gpus gives {here}" if options.gpus is not None else
               f"executor.gpus gives {here}" if executor.settings.devices is not None else
               "this machine has no GPU (CUDA sees none)" if here == 0 else
               f"this machine has {here}")
    else:
        return
    raise CapsmedError(f"{pipeline.path}: {len(wanting)} training run(s) ask for "
                       f"{asked} GPU(s) each (resources.gpus) and would get none: {why}; "
                       "pass --allow-cpu to train them on CPUs")


def check_devices(pipeline: Pipeline, options: RunOptions, executor: Executor) -> None:
    """The local executor's GPUs (``--gpus``, ``executor.gpus``) are GPUs CUDA sees
    here: a run told another one sees no GPU and trains on the CPU. Without any GPU
    here, ``--allow-cpu`` lets them through (jobs then train on CPUs)."""
    given = executor.settings.devices
    if executor.name != "local" or not given:
        return
    from capsmed.pipeline.executors.local import visible_gpus

    seen = visible_gpus()
    absent = [d for d in given if d not in seen]
    if not absent or (options.allow_cpu and not seen):
        return
    where = "--gpus" if options.gpus is not None else f"{pipeline.path}: executor.gpus"
    sees = f"CUDA sees {','.join(seen)}" if seen else "CUDA sees no GPU here"
    raise CapsmedError(f"{where}: no GPU {', '.join(absent)} on this machine ({sees}); "
                       "its jobs would train on the CPU" + (
                           "" if seen else " (pass --allow-cpu to let them)"))


@dataclass
class Prepared:
    """A checked plan: what ``capsmed run`` would submit, and to which executor."""

    state: PipelineState
    runs: list[RunSpec]
    executor: Executor
    items: list[WorkItem]
    finished: list[RunSpec]


def prepare(pipeline: Pipeline, options: RunOptions,
            commands: set[tuple[str, ...]] | None = None, note: Any = None,
            warm: bool = False) -> Prepared:
    """Check everything the run would refuse (``--dry-run`` stops here) and build the
    work items; ``commands``: the capsmed commands that exist (stage commands are
    checked against them). ``warm``: let an executor that can get ready for the runs
    (the local one's workers import torch) start now, while the checks run."""
    check_options(options.retries, options.jobs, options.resources)
    state = PipelineState(pipeline.out).keep_digests()
    runs = select_runs(pipeline, options.only, options.exclude)
    if not runs:
        raise CapsmedError(f"{pipeline.path}: no run matches the selection")
    executor = executor_for(pipeline, options)
    if warm and hasattr(executor, "prewarm"):  # an optional capability
        executor.prewarm(len(runs))
    check_grid(pipeline, runs)
    if commands is not None:
        check_commands(pipeline, commands)
    stages = needed_stages(pipeline, runs)
    todo, finished = [], []
    for run, _, status in plan(pipeline, runs, state):
        (finished if status == "done" else todo).append(run)
    check_devices(pipeline, options, executor)
    check_gpus(pipeline, todo, options, executor)
    items = work_items(pipeline, state, stages, todo, runs, options.resources,
                       executor.gpus_available(), note or (lambda text: None),
                       options.allow_cpu)
    executor.check(items)
    check_inputs(pipeline, stages, state)  # last: a dry run shows the plan beside them
    return Prepared(state, runs, executor, items, finished)


def run_pipeline(pipeline: Pipeline, options: RunOptions,
                 commands: set[tuple[str, ...]] | None = None) -> int:
    """Run what is not finished; returns the exit code (1 if anything failed)."""
    started = time.monotonic()
    board = RunBoard(pipeline.name, len(select_runs(pipeline, options.only,
                                                    options.exclude)))
    ready = prepare(pipeline, options, commands, board.note, warm=not options.detach)
    state, executor = ready.state, ready.executor
    board.done.update(r.label for r in ready.finished)
    if ready.finished:
        board.note(f"{len(ready.finished)} of {len(ready.runs)} runs finished earlier")
    state.acquire_lock()
    if options.report and not options.detach:
        import_in_background(*REPORT_MODULES)
    interrupted = True  # until the jobs are followed to their end
    try:
        failures = follow(pipeline, state, executor, ready.items, options, board)
        interrupted = False
        if failures is None:  # detached
            return 0
        close_workers(wait=False)  # every job has ended: they exit during the report
        if options.report:
            write_report(pipeline, state, board)
    finally:
        try:
            executor.close(interrupted)  # Ctrl-C, SIGTERM: the jobs here save and stop
        finally:  # a second Ctrl-C must not leave the lock behind
            state.release_lock()
    board.summary(failures, time.monotonic() - started, state)
    return 1 if failures else 0


# What the study report imports (scipy.stats, matplotlib: 1.5-2 s on a 2-core machine)
REPORT_MODULES = ("capsmed.pipeline.study", "capsmed.evaluate.aggregate_report")


def import_in_background(*modules: str) -> None:
    """Import ``modules`` in a thread while the runner waits for its jobs, so the
    report does not wait for them at the end (an import that fails here fails again,
    with its message, where it is needed)."""
    import contextlib
    import importlib
    import threading

    def load() -> None:
        for module in modules:
            with contextlib.suppress(Exception):
                importlib.import_module(module)

    threading.Thread(target=load, daemon=True, name="capsmed-report-imports").start()


def start_in_background(argv: Sequence[str], pipeline: Pipeline, timeout: float = 120.0
                        ) -> str:
    """``--detach`` for an executor whose jobs end with their runner: start the same
    ``capsmed run`` (``argv``, without --detach) as a background process of its own
    session, wait until it holds the study's folder, and say how to follow it."""
    import os
    import subprocess
    import sys

    from capsmed.pipeline.state import lock_holder

    state = PipelineState(pipeline.out).keep_digests()
    state.check_writable()  # a read-only folder is one line, not a traceback
    log_path = state.records / "runner.log"
    with log_path.open("a", encoding="utf-8") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "capsmed", *argv], stdout=log_file,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=os.getcwd())
    deadline = time.monotonic() + timeout
    while lock_holder(state.records / "runner.lock") != proc.pid:
        if proc.poll() is not None or time.monotonic() > deadline:
            lines = log_path.read_text(encoding="utf-8").strip().splitlines()
            raise CapsmedError(f"{log_path}: the background runner stopped before it "
                               f"started ({lines[-1] if lines else 'no output'})")
        time.sleep(0.2)
    return (f"runner started in the background (pid {proc.pid}); its output: {log_path}\n"
            f"where it stands: capsmed run status {shell_quoted(pipeline.path)}\n"
            f"wait for it: capsmed run wait {shell_quoted(pipeline.path)}")


def wait_pipeline(pipeline: Pipeline, options: RunOptions, patience: float = 5.0) -> int:
    """``capsmed run wait``: follow the study's live jobs until they end (submitting
    nothing), then write the report; 1 when a selected run is not finished. Waits
    first for a runner that holds the folder. Without --executor, the executor is the
    one the ledger's jobs are in."""
    state = PipelineState(pipeline.out).keep_digests()
    runs = select_runs(pipeline, options.only, options.exclude)
    if options.executor is None:
        options = replace(options, executor=ledger_executor(state))
    executor = executor_for(pipeline, options)
    board = RunBoard(pipeline.name, len(runs))
    started = time.monotonic()
    state.acquire_lock(wait_seconds=patience, on_wait=board.note)
    try:
        todo = [run for run, _, status in plan(pipeline, runs, state) if status != "done"]
        board.done.update(r.label for r in runs if r not in todo)
        items = work_items(pipeline, state, needed_stages(pipeline, runs), todo, runs,
                           options.resources, executor.gpus_available(), lambda text: None,
                           True)
        failures = follow(pipeline, state, executor, items, options, board,
                          submit=False) or {}
        for row in run_rows(state, plan(pipeline, runs, state), jobs_now(state, None)):
            if row.status != "finished":
                failures.setdefault(row.label, f"{row.status}" + (
                    f": {row.detail}" if row.detail else "") + f" (capsmed run "
                    f"{pipeline.path} runs it again)")
        if options.report:
            write_report(pipeline, state, board)
    finally:
        state.release_lock()
    board.summary(failures, time.monotonic() - started, state)
    return 1 if failures else 0


def foreign_run_dirs(pipeline: Pipeline, state: PipelineState) -> list[Path]:
    """Folders under ``out/runs`` that belong to no run of the pipeline as it is now:
    their options, data or capsmed's protocol revision changed since. Folders of a run
    whose identity cannot be known yet (its data not made) are never counted."""
    current, unknown = set(), set()
    for run, run_id, _ in plan(pipeline, pipeline.runs, state):
        if run_id is None:
            unknown.add(run.label)
        else:
            current.add(state.run_dir(run, run_id))
    folder = state.out / "runs"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and p not in current
                  and p.name.rpartition("-")[0] not in unknown)


def pipeline_file(name_or_path: str) -> Path:
    """The study ``capsmed run NAME`` means: an existing file, else a bundled study's
    name (``smoke``, ``jimenez2018``; ``capsmed/bundled.py``)."""
    path = Path(name_or_path)
    if path.is_file():  # a file always wins over a bundled study of the same name
        return path
    studies = bundled_pipelines()
    found = studies.get(name_or_path.removesuffix(".yaml"))
    if found is not None and path.name == name_or_path:  # a bare name, not a/b/smoke
        return found
    names = ", ".join(studies) or "none: this capsmed carries no pipelines/"
    raise CapsmedError(f"{name_or_path}: no such pipeline file or bundled study "
                       f"(bundled: {names})")
