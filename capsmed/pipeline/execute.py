"""Do one piece of a pipeline: a data stage, a run (train + evaluate) or an analysis.

Each piece runs ``capsmed`` commands in child processes
(:mod:`capsmed.pipeline.processes`), and what is left to do is read from the files
each time, so a piece interrupted at any point (killed, preempted, requeued)
continues where its files say it stopped. :mod:`capsmed.pipeline.tasks` wraps these
functions into the tasks every executor runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
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
from capsmed.pipeline.processes import capsmed_argv, run_logged
from capsmed.pipeline.spec import Analysis, Pipeline, RunSpec, Stage
from capsmed.pipeline.state import PipelineState, evaluation_current
from capsmed.pipeline.work import Placement
from capsmed.pipeline.workers import run_in_worker

INTERRUPTED = 130  # capsmed's exit code for a stop on request (the state is saved)
INTERRUPTED_REASON = "interrupted (its state is saved; the next run resumes it)"


def command_hash(commands: Sequence[Sequence[str]]) -> str:
    """The stage's commands and capsmed's :data:`~capsmed.data.schema.DATA_REVISION`:
    a file made by older readers is made again, as one made by other commands is."""
    payload = {"commands": [list(c) for c in commands], "revision": DATA_REVISION}
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]


def _stage_record(state: PipelineState, name: str) -> Path:
    return state.records / "stages" / f"{name}.json"


def command_inputs(stage: Stage, out: Path) -> list[Path]:
    """Files and folders outside the study's ``out`` that the stage's commands name and
    its ``requires:`` does not cover (``--set images=DIR`` in a pipeline without a
    ``requires`` of it): read as raw input all the same, so fingerprinted too. So is a
    path after ``=`` (``--split-file train=lists/train.txt``, ``--groups-csv=meta/g.csv``):
    an edited split list would otherwise remake nothing."""
    # what it makes is not what it reads: its output, its scratch and the study's out
    skip = [Path(p).absolute() for p in (*(r.path for r in stage.requires), out,
                                         stage.output, *stage.scratch)]
    words = (w for command in stage.commands for a in command
             for w in (a, *([a.split("=", 1)[1]] if "=" in a else [])))
    found: list[Path] = []
    for arg in dict.fromkeys(words):
        if os.sep not in arg or not os.path.exists(arg):
            continue
        path = Path(arg).absolute()
        if any(path == c or c in path.parents for c in skip):
            continue
        found.append(path)
    return found


def inputs_fingerprint(stage: Stage, out: Path) -> str | None:
    """A hash of the raw files a stage reads (its ``requires:`` paths, and the paths
    outside ``out`` its commands name): every file's path, size and modification time,
    so that a file added, removed, renamed (two class folders swapped) or rewritten
    makes the stage run again. None when the stage names no input."""
    roots = [Path(r.path) for r in stage.requires]
    implicit = command_inputs(stage, out)
    if not roots and not implicit:
        return None
    h = hashlib.sha256()
    for i, root in enumerate([*roots, *implicit]):
        # implicit inputs under a marker: a stage whose requires: cover every path it
        # names keeps the fingerprint it was recorded with
        h.update(f"\0{'+' if i >= len(roots) else ''}{root}".encode())
        for path in _files(root):
            try:
                st = path.stat()
            except OSError:
                continue
            h.update(f"\0{path.relative_to(root) if path != root else '.'}"
                     f"\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    out = []
    for folder, dirs, names in os.walk(root, followlinks=True):
        dirs.sort()
        out += [Path(folder) / n for n in sorted(names)]
    return out


def stage_done(state: PipelineState, stage: Stage) -> bool:
    """The output exists and was made by these commands from these raw files (or the
    user put it there)."""
    if not stage.output.is_file():
        return False
    try:
        made = json.loads(_stage_record(state, stage.name).read_text())
        made_by = made["commands"]
    except (OSError, ValueError, KeyError, TypeError):
        return True  # a file the user put there: trusted, never overwritten
    if made_by != command_hash(stage.commands):
        return False
    # a stage recorded without inputs that now names some is made once more
    return made.get("inputs") == inputs_fingerprint(stage, state.out)


def remade_outputs(pipeline: Pipeline, state: PipelineState) -> set[str]:
    """Data files that exist but will be made again (their stage's commands or raw
    inputs changed): the runs that read them may train under a new identity."""
    return {str(s.output) for s in pipeline.stages.values()
            if s.output.is_file() and not stage_done(state, s)}


def current_identity(run: RunSpec, remade: set[str]) -> str | None:
    """The run's identity, or None while its data file is missing or to be remade
    (the identity of the file there now belongs to the old data). An evaluation's
    other data file is not part of it: a remade one is evaluated again."""
    return None if str(run.train.get("data")) in remade else run_identity(run)


def execute_stage(state: PipelineState, stage: Stage, env: Mapping[str, str],
                  persistent: bool = False) -> str | None:
    """Make a stage's output; returns None, or the reason it failed. ``persistent``:
    see :func:`run_command`."""
    log = state.out / "logs" / f"data-{stage.name}.log"
    for path in stage.scratch:  # a half-made raw folder from an interrupted attempt
        shutil.rmtree(path, ignore_errors=True)
    inputs = inputs_fingerprint(stage, state.out)  # before: a change while it runs makes it again
    # Here with an existing output only when this stage made it with other commands:
    # set it aside (preprocess refuses to overwrite), and put it back if the new fail.
    previous = stage.output.with_name(stage.output.name + ".previous")
    if stage.output.is_file():
        os.replace(stage.output, previous)
    for argv in stage.commands:
        if run_command(capsmed_argv(*argv), log, env, persistent) != 0:
            _restore(previous, stage.output)
            return f"'capsmed {' '.join(argv[:2])}' failed; see {log}"
    if not stage.output.is_file():
        _restore(previous, stage.output)
        return f"its commands did not write {stage.output}; see {log}"
    previous.unlink(missing_ok=True)
    write_text_atomic(_stage_record(state, stage.name), json.dumps(
        {"commands": command_hash(stage.commands), "inputs": inputs}))
    return None


def _restore(previous: Path, output: Path) -> None:
    if previous.is_file() and not output.exists():
        os.replace(previous, output)


def file_status(run_dir: Path) -> str:
    """What a run folder holds: trained, interrupted (resume.pt), started or pending.
    resume.pt beside summary.json is a run killed while it finished (its trackers, the
    state's removal): ``--resume`` finishes it without training."""
    if (run_dir / "resume.pt").is_file():
        return "interrupted"
    if (run_dir / "summary.json").is_file():
        return "trained"
    return "started" if run_dir.exists() else "pending"


def training_argv(state: PipelineState, run: RunSpec, run_id: str, placement: Placement,
                  prepare: bool = True) -> list[str]:
    """The ``capsmed train`` command that continues ``run`` from its files ([] once it
    is trained). ``prepare``: this process owns the folder (rank 0): it clears a run
    killed before its folder was whole."""
    run_dir = state.run_dir(run, run_id)
    status = file_status(run_dir)
    if status == "started" and prepare:  # killed before its folder was whole: start over
        shutil.rmtree(run_dir)
    # damaged weights, or a transfer run's layers of its source's former weights: the run
    # trains again from the start. Every task of a multi-task job decides so (the others
    # returned [] and never joined the training rank 0 started); rank 0 sets the folder
    # aside, kept for a look.
    aside = ("damaged" if status == "trained" and state.damaged(run_dir) else
             "stale" if status in ("trained", "interrupted")
             and state.stale_transfer(run, run_dir) else None)
    if aside is not None:
        if prepare:
            set_aside(run_dir, aside)
        status = "pending"
    if status in ("started", "pending"):
        config = state.config_path(run_id)  # every rank writes the same text, atomically
        write_text_atomic(config, yaml.safe_dump(run.train, sort_keys=False))
        args = ["train", "--config", str(config), "--out", str(run_dir)]
    elif status == "interrupted":
        args = ["train", "--resume", str(run_dir)]
    else:
        return []
    return capsmed_argv(*args, processes=placement.processes)


def set_aside(run_dir: Path, why: str = "damaged") -> Path:
    """Move a damaged (or stale) run folder to ``<folder>.<why>-N`` (the first free N)."""
    n = 1
    while run_dir.with_name(f"{run_dir.name}.{why}-{n}").exists():
        n += 1
    aside = run_dir.with_name(f"{run_dir.name}.{why}-{n}")
    os.replace(run_dir, aside)
    return aside


def execute_run(state: PipelineState, run: RunSpec, run_id: str,
                placement: Placement | None = None) -> str | None:
    """Train (or resume) and evaluate one run; returns None, or why it failed."""
    placement = placement or Placement()
    run_dir, log = state.run_dir(run, run_id), state.log_path(run, run_id)
    if placement.rank != 0:  # one task of a multi-task job: rank 0 keeps the books
        argv = training_argv(state, run, run_id, placement, prepare=False)
        return (f"training failed (rank {placement.rank}); see {log}"
                if argv and run_logged(argv, log, placement.env) != 0 else None)
    argv = training_argv(state, run, run_id, placement)
    code = run_command(argv, log, placement.env, placement.persistent) if argv else 0
    if code == INTERRUPTED:
        return f"{INTERRUPTED_REASON}; see {log}"
    if code != 0:
        return f"training failed; see {log}"
    for e in run.evaluations:
        if evaluation_current(run_dir, e):
            continue
        args = ["evaluate", str(run_dir), "--report-name", e.name, "--split", e.split,
                "--no-grids"]
        args += ["--data", e.data] if e.data else []
        args += ["--agreement"] if e.agreement else []
        args += ["--batch-size", str(e.batch_size)] if e.batch_size else []
        code = run_command(capsmed_argv(*args), log, placement.env, placement.persistent)
        if code != 0:
            return f"evaluation '{e.name}' failed; see {log}"
    return state.damaged(run_dir)  # weights read once here: later checks only stat them


def run_command(argv: Sequence[str], log: Path, env: Mapping[str, str],
                persistent: bool = False) -> int:
    """A ``capsmed`` command (``argv`` from :func:`capsmed_argv`) with its output in
    ``log``: in the executor's long-lived worker when it keeps them (``persistent``)
    and the command is one process, else in a fresh child process."""
    plain = capsmed_argv()
    if persistent and list(argv[:len(plain)]) == plain:
        return run_in_worker(argv[len(plain):], log, env)
    return run_logged(argv, log, env)


def analysis_runs(analysis: Analysis, runs: Sequence[RunSpec]) -> list[RunSpec]:
    """The runs the ``{runs:FILTER}`` arguments of an analysis select."""
    filters = [f for f in map(run_filter, analysis.command) if f is not None]
    return [r for r in runs if any(r.matches(f) for f in filters)]


def expand_command(analysis: Analysis, runs: Sequence[RunSpec], state: PipelineState,
                   where: Path | str) -> list[str]:
    """The command with each ``{runs:FILTER}`` (a whole argument) replaced by the
    folders of the matching ``runs`` (the whole grid's)."""
    out = []
    for arg in analysis.command:
        selection = run_filter(arg)
        if selection is None:
            out.append(arg)
            continue
        dirs = [str(state.run_dir(r, run_identity(r) or "-")) for r in runs
                if r.matches(selection)]
        if not dirs:  # checked when the file is read; here if the grid was changed since
            raise CapsmedError(f"{where}: analyses.{analysis.name}: {arg} matches no run")
        out += dirs
    return out


def analysis_argv(analysis: Analysis, pipeline: Pipeline, state: PipelineState) -> list[str]:
    return expand_command(analysis, pipeline.runs, state, pipeline.path)


def inputs_of(stages: Sequence[Stage], argv: Sequence[str]) -> dict[str, str]:
    """Content digests of the data stage outputs a command names, so that a dataset
    made again makes the analyses that read it run again."""
    return {str(s.output): file_digest(s.output) for s in stages
            if s.output.is_file() and any(str(s.output) in word for word in argv)}


def analysis_inputs(pipeline: Pipeline, argv: Sequence[str]) -> dict[str, str]:
    return inputs_of(list(pipeline.stages.values()), argv)


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
                     inputs: Mapping[str, str], env: Mapping[str, str],
                     persistent: bool = False) -> str | None:
    log = state.out / "logs" / f"analysis-{analysis.name}.log"
    started = time.monotonic()
    if run_command(capsmed_argv(*argv), log, env, persistent) != 0:
        return f"analysis '{analysis.name}' failed; see {log}"
    write_text_atomic(state.records / "analyses" / f"{analysis.name}.json", json.dumps(
        {"command": command_hash([argv]), "inputs": dict(inputs),
         "seconds": round(time.monotonic() - started, 1)}))
    return None
