"""Do one piece of a pipeline: a data stage, a run (train + evaluate) or an analysis.

Each piece is a ``capsmed`` command in a child process whose output goes to a log
file, so a failing run never takes the runner down and every executor (local
processes, Slurm jobs) runs exactly the same code. Children get SIGTERM if the
process that started them dies (Linux ``PR_SET_PDEATHSIG``): a runner killed with
SIGKILL leaves no orphan training behind, and the orphan's SIGTERM makes it save
``resume.pt``, so the next runner resumes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from capsmed.data.digest import file_digest
from capsmed.data.schema import DATA_REVISION
from capsmed.errors import CapsmedError
from capsmed.io import write_text_atomic
from capsmed.pipeline.checks import run_filter
from capsmed.pipeline.identity import run_identity
from capsmed.pipeline.spec import Analysis, Pipeline, RunSpec, Stage
from capsmed.pipeline.state import PipelineState


def capsmed_argv(*args: str) -> list[str]:
    """The same capsmed as this process, as a command line."""
    return [sys.executable, "-m", "capsmed", *args]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    # not Linux (no libc.so.6): children outlive a killed runner, as with any other tool
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def run_logged(argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> int:
    """Run ``argv`` with stdout and stderr appended to ``log``; returns the exit code."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"\n$ {' '.join(argv)}\n")
        fh.flush()
        proc = subprocess.run(list(argv), stdout=fh, stderr=subprocess.STDOUT,
                              env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
                              preexec_fn=_die_with_parent if os.name == "posix" else None)
    return proc.returncode


def command_hash(commands: Sequence[Sequence[str]]) -> str:
    """The stage's commands and capsmed's :data:`~capsmed.data.schema.DATA_REVISION`:
    a file made by older readers is made again, as one made by other commands is."""
    payload = {"commands": [list(c) for c in commands], "revision": DATA_REVISION}
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]


def _stage_record(state: PipelineState, name: str) -> Path:
    return state.records / "stages" / f"{name}.json"


def stage_done(state: PipelineState, stage: Stage) -> bool:
    """The output exists and was made by these commands (or given by the user)."""
    if not stage.output.is_file():
        return False
    try:
        made_by = json.loads(_stage_record(state, stage.name).read_text())["commands"]
    except (OSError, ValueError, KeyError):
        return True  # a file the user put there: trusted, never overwritten
    return made_by == command_hash(stage.commands)


def remade_outputs(pipeline: Pipeline, state: PipelineState) -> set[str]:
    """Data files that exist but will be made again (their stage's commands changed):
    the runs that read them will train under a new identity."""
    return {str(s.output) for s in pipeline.stages.values()
            if s.output.is_file() and not stage_done(state, s)}


def current_identity(run: RunSpec, remade: set[str]) -> str | None:
    """The run's identity, or None while a file it reads is missing or to be remade
    (the identity of the file there now belongs to the old data)."""
    inputs = {str(run.train.get("data"))} | {str(e.data) for e in run.evaluations if e.data}
    return None if inputs & remade else run_identity(run)


def execute_stage(state: PipelineState, stage: Stage, env: Mapping[str, str]) -> str | None:
    """Make a stage's output; returns None, or the reason it failed."""
    log = state.out / "logs" / f"data-{stage.name}.log"
    for path in stage.scratch:  # a half-made raw folder from an interrupted attempt
        shutil.rmtree(path, ignore_errors=True)
    # Here with an existing output only when this stage made it with other commands:
    # set it aside (preprocess refuses to overwrite), and put it back if the new fail.
    previous = stage.output.with_name(stage.output.name + ".previous")
    if stage.output.is_file():
        os.replace(stage.output, previous)
    for argv in stage.commands:
        if run_logged(capsmed_argv(*argv), log, env) != 0:
            _restore(previous, stage.output)
            return f"'capsmed {' '.join(argv[:2])}' failed; see {log}"
    if not stage.output.is_file():
        _restore(previous, stage.output)
        return f"its commands did not write {stage.output}; see {log}"
    previous.unlink(missing_ok=True)
    write_text_atomic(_stage_record(state, stage.name),
                      json.dumps({"commands": command_hash(stage.commands)}))
    return None


def _restore(previous: Path, output: Path) -> None:
    if previous.is_file() and not output.exists():
        os.replace(previous, output)


def execute_run(state: PipelineState, run: RunSpec, run_id: str,
                env: Mapping[str, str] | None = None) -> str | None:
    """Train (or resume) and evaluate one run; returns None, or why it failed.

    What to do is read from the run directory each time, so a run interrupted at any
    point (killed, preempted, requeued) continues where its files say it stopped.
    """
    run_dir, log = state.run_dir(run, run_id), state.log_path(run, run_id)
    state.mark_running(run_id)
    try:
        status = state.status(run, run_id)
        if status in ("running", "failed"):  # our own marker / an earlier attempt
            status = _file_status(run_dir)
        if status == "started":  # killed before its first epoch ended: start over
            shutil.rmtree(run_dir)
            status = "pending"
        if status == "pending":
            config = state.config_path(run_id)
            write_text_atomic(config, yaml.safe_dump(run.train, sort_keys=False))
            argv = capsmed_argv("train", "--config", str(config), "--out", str(run_dir))
        elif status == "interrupted":
            argv = capsmed_argv("train", "--resume", str(run_dir))
        else:
            argv = []
        if argv and run_logged(argv, log, env) != 0:
            return f"training failed; see {log}"
        for e in run.evaluations:
            if (run_dir / e.name / "report.json").is_file():
                continue
            args = ["evaluate", str(run_dir), "--report-name", e.name, "--split", e.split,
                    "--no-grids"]
            args += ["--data", e.data] if e.data else []
            args += ["--agreement"] if e.agreement else []
            args += ["--batch-size", str(e.batch_size)] if e.batch_size else []
            if run_logged(capsmed_argv(*args), log, env) != 0:
                return f"evaluation '{e.name}' failed; see {log}"
        return None
    finally:
        state.clear_running(run_id)


def _file_status(run_dir: Path) -> str:
    if (run_dir / "summary.json").is_file():
        return "trained"
    if (run_dir / "resume.pt").is_file():
        return "interrupted"
    return "started" if run_dir.exists() else "pending"


def analysis_runs(analysis: Analysis, runs: Sequence[RunSpec]) -> list[RunSpec]:
    """The runs the ``{runs:FILTER}`` arguments of an analysis select."""
    filters = [f for f in map(run_filter, analysis.command) if f is not None]
    return [r for r in runs if any(r.matches(f) for f in filters)]


def analysis_argv(analysis: Analysis, pipeline: Pipeline, state: PipelineState) -> list[str]:
    """The command with each ``{runs:FILTER}`` (a whole argument) replaced by the
    folders of the matching runs of the whole grid."""
    out = []
    for arg in analysis.command:
        selection = run_filter(arg)
        if selection is None:
            out.append(arg)
            continue
        dirs = [str(state.run_dir(r, run_identity(r) or "-")) for r in pipeline.runs
                if r.matches(selection)]
        if not dirs:  # checked when the file is read; here if the grid was changed since
            raise CapsmedError(f"{pipeline.path}: analyses.{analysis.name}: {arg} matches "
                               "no run")
        out += dirs
    return out


def analysis_inputs(pipeline: Pipeline, argv: Sequence[str]) -> dict[str, str]:
    """Content digests of the data stage outputs an analysis command names, so that
    a dataset made again makes the analyses that read it run again."""
    return {str(s.output): file_digest(s.output) for s in pipeline.stages.values()
            if s.output.is_file() and any(str(s.output) in word for word in argv)}


def analysis_done(state: PipelineState, analysis: Analysis, argv: Sequence[str],
                  inputs: Mapping[str, str]) -> bool:
    """Made by this command from these data files (and its output, if any, exists)."""
    record = state.records / "analyses" / f"{analysis.name}.json"
    try:
        made = json.loads(record.read_text())
        same = made["command"] == command_hash([argv]) and made.get("inputs", {}) == inputs
        return same and (analysis.output is None or analysis.output.exists())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def analysed_run_dirs(pipeline: Pipeline, state: PipelineState) -> set[str]:
    """Run folders that the pipeline's analyses, as it now stands, have written to:
    the only ones whose ``analysis/`` files a table may read."""
    out: set[str] = set()
    for analysis in pipeline.analyses:
        argv = analysis_argv(analysis, pipeline, state)
        if analysis_done(state, analysis, argv, analysis_inputs(pipeline, argv)):
            out |= {str(state.run_dir(r, run_identity(r) or "-"))
                    for r in analysis_runs(analysis, pipeline.runs)}
    return out


def execute_analysis(state: PipelineState, analysis: Analysis, argv: Sequence[str],
                     inputs: Mapping[str, str], env: Mapping[str, str]) -> str | None:
    log = state.out / "logs" / f"analysis-{analysis.name}.log"
    started = time.monotonic()
    if run_logged(capsmed_argv(*argv), log, env) != 0:
        return f"analysis '{analysis.name}' failed; see {log}"
    write_text_atomic(state.records / "analyses" / f"{analysis.name}.json", json.dumps(
        {"command": command_hash([argv]), "inputs": dict(inputs),
         "seconds": round(time.monotonic() - started, 1)}))
    return None
