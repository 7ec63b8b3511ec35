"""What capsmed run reads back from its folder: run status when data will be remade,
analyses redone on new data, the study report over the whole grid and never stale,
running markers of dead jobs, and the runner lock. No training: run folders and data
files are stand-ins (any bytes have a content digest)."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from capsmed.errors import CapsmedError
from capsmed.pipeline import execute, runner, tasks
from capsmed.pipeline import state as state_module
from capsmed.pipeline.display import RunBoard
from capsmed.pipeline.identity import run_identity
from capsmed.pipeline.items import work_items
from capsmed.pipeline.spec import load_pipeline
from capsmed.pipeline.state import PipelineState
from capsmed.pipeline.status import jobs_now, run_rows
from capsmed.pipeline.work import Placement
from tests.pipeline_stand_ins import finish_run

SMOKE = Path(__file__).resolve().parents[1] / "pipelines" / "smoke.yaml"


def _pipeline(tmp_path: Path, change=None):
    """The smoke pipeline in ``tmp_path/out``, its data file a stand-in."""
    raw = copy.deepcopy(yaml.safe_load(SMOKE.read_text()))
    raw["variables"]["out"] = str(tmp_path / "out")
    if change:
        change(raw)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    pipeline = load_pipeline(path)
    data = pipeline.stages["tupac16"].output
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_bytes(b"version 1")
    return pipeline, PipelineState(pipeline.out)


def _finished(state: PipelineState, run, evaluation: str = "report",
              files: dict | None = None) -> Path:
    return finish_run(state.run_dir(run, run_identity(run)), (evaluation,), files)


def _run(pipeline, label):
    return next(r for r in pipeline.runs if r.label == label)


def _rows(pipeline, state, poll=None):
    return run_rows(state, runner.plan(pipeline, pipeline.runs, state), jobs_now(state, poll))


def test_runs_on_data_to_be_remade_are_outdated_not_done(tmp_path):
    pipeline, state = _pipeline(tmp_path)
    _finished(state, pipeline.runs[0])
    assert _rows(pipeline, state)[0].status == "finished"
    record = state.records / "stages" / "tupac16.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"commands": "made-by-other-commands"}))
    rows = _rows(pipeline, state)
    assert {(r.status, r.detail, r.run_id) for r in rows} == {
        ("not submitted", "its data will be made again", None)}
    assert runner.foreign_run_dirs(pipeline, state) == []  # their identity is unknown yet


def test_a_new_protocol_revision_trains_finished_runs_again(tmp_path, monkeypatch, capsys):
    from capsmed.pipeline import identity
    from capsmed.pipeline.display import print_overview
    from capsmed.pipeline.overview import study_overview

    pipeline, state = _pipeline(tmp_path)
    old = _finished(state, pipeline.runs[0])
    assert _rows(pipeline, state)[0].status == "finished"
    assert runner.foreign_run_dirs(pipeline, state) == []
    monkeypatch.setattr(identity, "PROTOCOL_REVISION", identity.PROTOCOL_REVISION + 1)
    row = _rows(pipeline, state)[0]
    assert row.status == "not submitted" and row.run_id not in old.name
    assert runner.foreign_run_dirs(pipeline, state) == [old]
    print_overview(study_overview(pipeline, runner.RunOptions(), False), _console(),
                   False, False)
    out = " ".join(capsys.readouterr().out.split())
    assert (f"1 folder(s) in {old.parent} belong to no run of this pipeline now" in out
            and old.name in out)


def test_data_made_by_an_older_data_revision_is_made_again(tmp_path, monkeypatch):
    pipeline, state = _pipeline(tmp_path)
    stage = pipeline.stages["tupac16"]
    record = state.records / "stages" / "tupac16.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"commands": execute.command_hash(stage.commands)}))
    assert execute.stage_done(state, stage)
    monkeypatch.setattr(execute, "DATA_REVISION", execute.DATA_REVISION + 1)
    assert not execute.stage_done(state, stage)
    assert execute.remade_outputs(pipeline, state) == {str(stage.output)}


def _console():
    from rich.console import Console

    return Console(width=80, force_terminal=False)


def test_analyses_run_again_when_a_dataset_they_read_is_remade(tmp_path, monkeypatch):
    pipeline, state = _pipeline(tmp_path, lambda raw: raw.update({"analyses": [
        {"name": "transfer", "output": "{out}/analysis/transfer",
         "command": ["analyze", "transfer", "--a", "{datasets.tupac16}", "-o", "{output}"]}]}))
    calls = []
    monkeypatch.setattr(execute, "run_logged", lambda argv, log, env=None: calls.append(
        argv) or (pipeline.out / "analysis" / "transfer").mkdir(parents=True, exist_ok=True)
        or 0)
    assert _run_analyses(pipeline, state) == [None]
    assert _run_analyses(pipeline, state) == []  # done with this command and data
    assert len(calls) == 1
    pipeline.stages["tupac16"].output.write_bytes(b"version 2")
    assert _run_analyses(pipeline, state) == [None]
    assert len(calls) == 2


def _run_analyses(pipeline, state) -> list:
    """The analyses the runner would submit (no run to train), each run here."""
    items = work_items(pipeline, state, [], [], pipeline.runs, {}, 0, RunBoard("t", 0).note)
    return [item.task(Placement()) for item in items if item.kind == "analysis"]


def test_a_table_reads_only_analysis_files_of_the_current_analyses(tmp_path, monkeypatch):
    from capsmed.pipeline.study import table_values

    pipeline, state = _pipeline(tmp_path)
    for seed, entropy in ((0, 0.25), (1, 0.75)):  # left by an earlier pipeline version
        _finished(state, _run(pipeline, f"tupac16-capsnet-full-seed{seed}"), "old",
                  {"analysis/routing/routing.json": {"runs": [{"test_entropy": entropy}]}})
    routing = pipeline.report["tables"][2]

    def values():
        analysed = execute.analysed_run_dirs(pipeline, state)
        return [(r.label, v) for r, v in table_values(routing, pipeline, state,
                                                      pipeline.runs, "macro_f1", analysed)]

    assert values() == []
    monkeypatch.setattr(execute, "run_logged", lambda argv, log, env=None: 0)
    only_seed0 = pipeline.analyses[0]
    argv = execute.analysis_argv(only_seed0, pipeline, state)
    execute.execute_analysis(state, only_seed0, argv, execute.analysis_inputs(pipeline, argv),
                             {})
    assert values() == [("tupac16-capsnet-full-seed0", 0.25)]


def test_no_stale_study_report_is_left_when_nothing_is_evaluated(tmp_path):
    from capsmed.pipeline.study import write_study_report

    pipeline, state = _pipeline(tmp_path)
    old = state.out / "report"
    (old / "aggregate").mkdir(parents=True)
    (old / "study.md").write_text("# an earlier version's tables\n")
    (old / "study.html").write_text("<p>an earlier version's page</p>\n")
    assert write_study_report(pipeline, state, pipeline.runs) is None
    assert not (old / "study.md").exists() and not (old / "aggregate").exists()
    assert not (old / "study.html").exists()


def test_the_study_report_needs_no_evaluation_named_report(tmp_path):
    from capsmed.pipeline.study import write_study_report

    def change(raw):
        raw["evaluate"] = [{"name": "held-out", "split": "test"}]
        raw["report"]["tables"] = [{"title": "Epochs", "rows": "condition", "columns": "arch",
                                    "file": "summary.json", "key": "epochs_run"}]
    pipeline, state = _pipeline(tmp_path, change)
    _finished(state, pipeline.runs[0], evaluation="held-out")
    written = write_study_report(pipeline, state, pipeline.runs)
    assert written is not None and "1.000" in written.read_text()
    assert not (state.out / "report" / "aggregate").exists()
    page = (state.out / "report" / "study.html").read_text()  # issue 25: a study page
    assert page.startswith("<!DOCTYPE html>") and "<h2>Epochs</h2>" in page
    assert '<td class="num">1.000</td>' in page and "capsmed version" in page


def test_a_selection_reports_the_whole_grid_and_defers_analyses_it_cuts(tmp_path,
                                                                       monkeypatch, capsys):
    from capsmed.pipeline import study

    pipeline, state = _pipeline(tmp_path)
    reported = []
    monkeypatch.setattr(tasks, "execute_run", lambda state, run, run_id, placement:
                        _finished(state, run) and None)
    monkeypatch.setattr(study, "write_study_report",
                        lambda pipeline, state, runs: reported.append(list(runs)))
    ran = []
    monkeypatch.setattr(tasks, "execute_analysis", lambda state, a, *rest: ran.append(a.name))
    options = runner.RunOptions(only=["arch=capsnet", "seed=0"], gpus=[], jobs=1)
    assert runner.run_pipeline(pipeline, options) == 0
    assert [len(runs) for runs in reported] == [8]
    assert ran == ["routing-seed0"]  # its one run is selected; routing-seed1's is not
    assert "analysis 'routing-seed1' not run: it reads 1 run(s) outside" in capsys.readouterr().out


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_status_asks_the_executor_of_each_open_job_once(tmp_path):
    """The ledger names the jobs; one poll per executor says where they stand."""
    from capsmed.pipeline.ledger import Ledger
    from capsmed.pipeline.tasks import RunTask
    from capsmed.pipeline.work import FAILED, QUEUED, RUNNING, Job, JobState, WorkItem

    pipeline, state = _pipeline(tmp_path)
    ledger = Ledger(state.records)
    labels = [r.label for r in pipeline.runs[:4]]
    answers = {"7_0": JobState(RUNNING), "7_1": JobState(QUEUED, "Priority"),
               "7_2": JobState(FAILED, "Slurm: time limit reached")}
    for i, run in enumerate(pipeline.runs[:3]):
        item = WorkItem(f"run:{run.label}", run.label, RunTask(pipeline.out, run), None)
        ledger.submitted(item, Job(item.key, "slurm", f"7_{i}"))
    ledger.ended(Job(f"run:{labels[3]}", "slurm", "7_3"), JobState(FAILED))  # no entry
    polls = []

    def poll(name, jobs):
        polls.append((name, sorted(j.job_id for j in jobs)))
        return {j.job_id: answers[j.job_id] for j in jobs}

    rows = {r.label: r for r in _rows(pipeline, state, poll)}
    assert polls == [("slurm", ["7_0", "7_1", "7_2"])]
    assert (rows[labels[0]].status, rows[labels[0]].detail) == ("running", "job 7_0")
    assert (rows[labels[1]].status, rows[labels[1]].detail) == ("queued", "job 7_1, Priority")
    assert (rows[labels[2]].status, rows[labels[2]].detail) == ("failed",
                                                                "Slurm: time limit reached")
    assert rows[labels[3]].status == "not submitted"
    assert _rows(pipeline, state)[0].status == "not submitted"  # dry run: no poll


def test_a_failed_job_of_other_options_is_not_this_runs_status(tmp_path):
    """The ledger is keyed by label: a job that ran the label under other options (another
    identity) does not make the run of the current options 'failed' (CI: a runner
    killed mid-study, then a dry run with other epochs showed one run failed)."""
    from capsmed.pipeline.ledger import Ledger
    from capsmed.pipeline.tasks import RunTask
    from capsmed.pipeline.work import FAILED, Job, JobState, WorkItem

    pipeline, state = _pipeline(tmp_path)
    ledger = Ledger(state.records)
    died = JobState(FAILED, "ended with its runner (pid 1)")
    runs = pipeline.runs[:3]

    def submit(run, job, task=None):
        item = WorkItem(f"run:{run.label}", run.label, task or RunTask(pipeline.out, run),
                        None)
        ledger.submitted(item, Job(item.key, "local", job))
        ledger.ended(Job(item.key, "local", job), died)

    class Unknown:  # a run submitted before its data existed: identity not yet known
        kind = "run"

        def identity(self):
            return None

    # 0: the job recorded another identity; 1: no identity recorded, and a record of
    # another identity started after it; 2: no identity and nothing started (the job
    # died before its run began): that failure is the run's
    submit(runs[0], "a")
    ledger.path.write_text(ledger.path.read_text().replace(
        run_identity(runs[0]), "0ther1dentity"))
    submit(runs[1], "b", Unknown())
    state.write_record("0ther1dentit2", label=runs[1].label, started=time.time() + 1)
    submit(runs[2], "c", Unknown())
    rows = {r.label: r for r in _rows(pipeline, state)}
    assert rows[runs[0].label].status == "not submitted"
    assert rows[runs[1].label].status == "not submitted"
    assert (rows[runs[2].label].status, rows[runs[2].label].detail) == (
        "failed", "ended with its runner (pid 1)")
    # the job's own identity: its failure stands
    submit(runs[0], "d")
    assert {r.label: r for r in _rows(pipeline, state)}[runs[0].label].status == "failed"


def _lock(state: PipelineState) -> Path:
    return state.records / "runner.lock"


def test_a_lock_made_while_this_runner_starts_is_respected(tmp_path, monkeypatch):
    state = PipelineState(tmp_path)
    state.records.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    real_open = state_module.os.open

    def racing_open(path, flags, *args):  # another runner takes the lock just before us
        if not _lock(state).exists():
            _lock(state).write_text(json.dumps({"host": socket.gethostname(),
                                                "pid": sleeper.pid, "token": "other"}))
        return real_open(path, flags, *args)

    monkeypatch.setattr(state_module.os, "open", racing_open)
    try:
        with pytest.raises(CapsmedError, match="another capsmed run"):
            state.acquire_lock()
    finally:
        sleeper.kill()
    assert json.loads(_lock(state).read_text())["token"] == "other"


def test_a_lock_of_another_host_is_refused_with_how_to_remove_it(tmp_path):
    state = PipelineState(tmp_path)
    state.records.mkdir(parents=True)
    _lock(state).write_text(json.dumps({"host": "node-9", "pid": 12}))
    with pytest.raises(CapsmedError, match=f"node-9.*delete {_lock(state)}"):
        state.acquire_lock()


def test_a_dead_runners_lock_is_taken_and_only_ones_own_lock_released(tmp_path):
    state = PipelineState(tmp_path)
    state.records.mkdir(parents=True)
    _lock(state).write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid()}))
    state.acquire_lock()
    assert json.loads(_lock(state).read_text())["pid"] != 0
    _lock(state).write_text(json.dumps({"host": "node-9", "pid": 12, "token": "theirs"}))
    state.release_lock()  # not ours any more: left alone
    assert json.loads(_lock(state).read_text())["token"] == "theirs"
    _lock(state).unlink()
    state.acquire_lock()
    state.release_lock()
    assert not _lock(state).exists()


# A runner that starts one command (through run_logged, as every executor does) and is
# then killed: the command traps the SIGTERM its runner's death sends, as a training
# does to finish its step and save, and works on.
_KILLED_RUNNER = """
import os, sys, threading, time
from pathlib import Path
from capsmed.pipeline.processes import run_logged
log = Path(sys.argv[1])
# 'ready' spelled in two parts: the log's first line, the command itself, must not
# say it (the runner then exited before the child had started, and none was found)
child = "import signal, time; signal.signal(signal.SIGTERM, lambda *a: None); " \\
        "print('rea' + 'dy', flush=True); time.sleep(60)"
threading.Thread(target=run_logged, args=([sys.executable, "-c", child], log),
                 daemon=True).start()
while "ready" not in (log.read_text() if log.exists() else ""):
    time.sleep(0.05)
os._exit(0)  # as SIGKILL: no cleanup, the child is left behind
"""


def test_a_dead_runners_lock_is_not_taken_while_its_commands_still_run(tmp_path):
    """A runner killed with SIGKILL left its lock and its training behind (SIGTERM makes
    it save, a step or an epoch later); the next runner took the folder at once and
    trained the same run in the same folder (removed it, or resumed an older state)
    while the orphan still wrote there. Its commands carry its pid: the folder is
    refused (waited for, by `run wait`) until they have ended."""
    state = PipelineState(tmp_path / "out")
    state.records.mkdir(parents=True)
    runner_proc = subprocess.Popen([sys.executable, "-c", _KILLED_RUNNER,
                                    str(tmp_path / "cmd.log")],
                                   cwd=Path(__file__).resolve().parents[1])
    assert runner_proc.wait(timeout=60) == 0
    _lock(state).write_text(json.dumps({"host": socket.gethostname(),
                                        "pid": runner_proc.pid}))
    from capsmed.pipeline.processes import orphans_of

    [orphan] = orphans_of(runner_proc.pid)
    try:
        with pytest.raises(CapsmedError, match=rf"pid {runner_proc.pid}\) is gone.*"
                                               rf"\(pid {orphan}\) still run"):
            state.acquire_lock()
        assert json.loads(_lock(state).read_text())["pid"] == runner_proc.pid
    finally:
        os.kill(orphan, 9)
    deadline = time.monotonic() + 10
    while orphans_of(runner_proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    state.acquire_lock()  # its last command ended: the folder is taken over
    assert json.loads(_lock(state).read_text())["pid"] == os.getpid()
    state.release_lock()


def test_a_full_disk_while_taking_the_lock_leaves_no_lock(tmp_path, monkeypatch):
    """A full disk made the lock file but not its text: every rerun then met an
    unreadable lock and exited 1, after the space was freed."""
    import errno
    import io

    state = PipelineState(tmp_path)
    real = state_module.os.fdopen

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_module.os, "fdopen", lambda fd, *a, **k: (
        state_module.os.close(fd), Full())[1])
    with pytest.raises(CapsmedError, match="cannot write .No space left on device.; make "
                                           "room and run again"):
        state.acquire_lock()
    assert not _lock(state).exists()
    monkeypatch.setattr(state_module.os, "fdopen", real)
    _lock(state).write_text("")  # as an older capsmed, or a killed runner, left it
    old = time.time() - 120
    os.utime(_lock(state), (old, old))
    state.acquire_lock()  # taken over: a live runner writes its lock at once
    state.release_lock()
    assert not _lock(state).exists()


def test_an_evaluation_with_other_options_is_not_current(tmp_path):
    """A report of split test is not the report of an evaluation now asking for val, or
    for Agr, or for the run's own data after one on another file (it was reused)."""
    from capsmed.pipeline.spec import Evaluation
    from capsmed.pipeline.state import evaluation_current

    report = tmp_path / "report" / "report.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"split": "test", "data_digest": "sha256:x"}))
    assert evaluation_current(tmp_path, Evaluation(split="test"))
    assert not evaluation_current(tmp_path, Evaluation(split="val"))
    assert not evaluation_current(tmp_path, Evaluation(split="test", agreement=True))
    report.write_text(json.dumps({"split": "test", "agreement": {"agreement": 0.5}}))
    assert evaluation_current(tmp_path, Evaluation(split="test", agreement=True))
    assert not evaluation_current(tmp_path, Evaluation(split="test"))
    report.write_text(json.dumps({"split": "test", "other_data": True}))
    assert not evaluation_current(tmp_path, Evaluation(split="test"))
    assert not evaluation_current(tmp_path / "nothing", Evaluation())
    meta = {"arch": "lenet", "model_kwargs": {}, "epoch": 3, "data": "d.h5",
            "class_names": ["a", "b"], "weights_digest": "sha256:w1"}
    (tmp_path / "checkpoint.json").write_text(json.dumps(meta))
    report.write_text(json.dumps({"split": "test", "weights_digest": "sha256:w1"}))
    assert evaluation_current(tmp_path, Evaluation(split="test"))
    (tmp_path / "checkpoint.json").write_text(json.dumps({**meta, "weights_digest": "sha256:w2"}))
    assert not evaluation_current(tmp_path, Evaluation(split="test"))  # trained again


def test_a_folder_a_stage_command_names_outside_out_is_an_input(tmp_path):
    """--set images=DIR in a pipeline without requires: of it: removing a class folder
    from DIR remade nothing (the study's report still had the class)."""
    from capsmed.pipeline.stages import Stage

    images, out = tmp_path / "images", tmp_path / "out"
    for name in ("a", "b"):
        (images / name).mkdir(parents=True)
        (images / name / "1.png").write_bytes(b"x")
    output = out / "data" / "images.h5"
    stage = Stage("images", output, ((("synth", "folder", str(out / "raw")),
                                      ("preprocess", "folder", str(images), "-o",
                                       str(output)))), (), (out / "raw",), {}, {})
    assert execute.command_inputs(stage, out) == [images]  # not out/, not the output
    state = _stage_made(stage, out)
    assert execute.stage_done(state, stage)
    (images / "b" / "1.png").unlink()
    (images / "b").rmdir()
    assert not execute.stage_done(state, stage)


def _stage_made(stage, out):
    """The folder's state once ``stage`` has made its output (a stand-in) and recorded
    its commands and inputs."""
    state = PipelineState(out)
    stage.output.parent.mkdir(parents=True)
    stage.output.write_bytes(b"h5")
    record = state.records / "stages" / f"{stage.name}.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"commands": execute.command_hash(stage.commands),
                                  "inputs": execute.inputs_fingerprint(stage, out)}))
    return state


def test_a_file_a_stage_command_names_after_an_equals_sign_is_an_input(tmp_path):
    """--split-file train=FILE (and --opt=FILE): editing the split lists remade nothing,
    and the study trained and reported on the old splits."""
    from capsmed.pipeline.stages import Stage

    lists, out = tmp_path / "lists", tmp_path / "out"
    lists.mkdir()
    (lists / "train.txt").write_text("P01\nP02\n")
    (lists / "groups.csv").write_text("a.png,P01\n")
    output = out / "data" / "images.h5"
    stage = Stage("images", output, (("preprocess", "folder", str(out / "raw"), "-o",
                                      str(output), "--split-file",
                                      f"train={lists / 'train.txt'}",
                                      f"--groups-csv={lists / 'groups.csv'}"),),
                  (), (out / "raw",), {}, {})
    assert execute.command_inputs(stage, out) == [lists / "train.txt", lists / "groups.csv"]
    state = _stage_made(stage, out)
    assert execute.stage_done(state, stage)
    (lists / "train.txt").write_text("P01\n")
    assert not execute.stage_done(state, stage)


class _Cluster:
    """A scheduler whose jobs outlive the runner: every job submitted stays queued."""

    name, OPTIONS, detached, refresh_seconds = "slurm", frozenset(), True, 0.0

    def __init__(self, out: Path) -> None:
        from capsmed.pipeline.executors.base import ExecutorSettings

        self.settings = ExecutorSettings(out, "smoke")
        self.submitted: list[tuple[str, tuple[str, ...]]] = []
        self.cancelled: list[str] = []
        self.ended: dict = {}  # job id -> its final JobState (others stay queued)

    def gpus_available(self):
        return None

    def submit(self, items, placed):
        from capsmed.pipeline.work import Job

        known, jobs = {k: j.job_id for k, j in placed.items()}, []
        for item in items:
            self.submitted.append((item.key, tuple(known[k] for k in item.after
                                                   if k in known)))
            jobs.append(Job(item.key, self.name, f"9_{len(self.submitted)}"))
            known[item.key] = jobs[-1].job_id
        return jobs

    def poll(self, jobs):
        from capsmed.pipeline.work import QUEUED, JobState

        return {j.job_id: self.ended.get(j.job_id, JobState(QUEUED)) for j in jobs
                if j.job_id not in self.cancelled}

    def cancel(self, jobs):
        self.cancelled += [j.job_id for j in jobs]


def _detached_run(pipeline, state, cluster, runs, stages=()):
    from types import SimpleNamespace

    from capsmed.pipeline.follow import follow

    items = work_items(pipeline, state, list(stages), runs, pipeline.runs, {}, None,
                       lambda text: None, True)
    follow(pipeline, state, cluster, items, SimpleNamespace(retries=1, detach=True),
           RunBoard(pipeline.name, len(runs)))


def test_a_live_job_of_other_options_is_replaced_not_adopted(tmp_path):
    """--detach after a change of the runs' options re-attached to the queued jobs of the
    old options ('submitted 0 job(s)'): they trained what the YAML no longer says."""
    from types import SimpleNamespace

    from capsmed.pipeline.follow import follow
    from capsmed.pipeline.ledger import Ledger
    from capsmed.pipeline.work import FINISHED, JobState

    def epochs(n):
        return lambda raw: (raw.pop("analyses"), raw["variables"].update(epochs=n))

    pipeline, state = _pipeline(tmp_path, epochs(1))
    first = _Cluster(pipeline.out)
    _detached_run(pipeline, state, first, pipeline.runs[:2])
    assert [k for k, _ in first.submitted] == [f"run:{r.label}" for r in pipeline.runs[:2]]
    again = _Cluster(pipeline.out)  # unchanged: re-attached, nothing submitted
    _detached_run(pipeline, state, again, pipeline.runs[:2])
    assert again.submitted == [] and again.cancelled == []
    changed, _ = _pipeline(tmp_path, epochs(2))
    waiting = _Cluster(changed.out)  # capsmed run wait: neither followed nor cancelled
    asked = waiting.poll
    waiting.poll = lambda jobs: (asked(jobs), waiting.ended.update(  # ends once asked
        {j.job_id: JobState(FINISHED) for j in jobs}))[0]
    items = work_items(changed, state, [], changed.runs[:2], changed.runs, {}, None,
                       lambda text: None, True)
    assert follow(changed, state, waiting, items, SimpleNamespace(retries=1, detach=False),
                  RunBoard(changed.name, 2), submit=False) == {}
    assert waiting.cancelled == [] and waiting.submitted == []
    third = _Cluster(changed.out)
    _detached_run(changed, state, third, changed.runs[:2])
    assert sorted(third.cancelled) == ["9_1", "9_2"]
    assert [k for k, _ in third.submitted] == [f"run:{r.label}" for r in changed.runs[:2]]
    entries = Ledger(state.records).entries()
    assert {e.identity for e in entries.values()} == {run_identity(r)
                                                     for r in changed.runs[:2]}


def test_a_live_data_stage_job_of_other_commands_is_replaced_with_its_runs(tmp_path):
    """A queued data stage job of the old commands, adopted, made the old data and its
    runs (queued after it) trained on it."""
    def seed(value):
        def change(raw):
            raw.pop("analyses")
            raw["datasets"]["tupac16"]["commands"][1][-3] = value  # --seed of preprocess
        return change

    pipeline, state = _pipeline(tmp_path, seed("0"))
    pipeline.stages["tupac16"].output.unlink()  # the data stage is to be made
    first = _Cluster(pipeline.out)
    _detached_run(pipeline, state, first, pipeline.runs[:1], [pipeline.stages["tupac16"]])
    assert first.submitted == [("stage:tupac16", ()), (f"run:{pipeline.runs[0].label}",
                                                       ("9_1",))]
    changed, _ = _pipeline(tmp_path, seed("1"))
    changed.stages["tupac16"].output.unlink()
    second = _Cluster(changed.out)
    _detached_run(changed, state, second, changed.runs[:1], [changed.stages["tupac16"]])
    assert sorted(second.cancelled) == ["9_1", "9_2"]  # the run waited for the old stage
    assert second.submitted == [("stage:tupac16", ()), (f"run:{changed.runs[0].label}",
                                                        ("9_1",))]


def test_a_live_job_waiting_for_a_job_that_ended_is_submitted_again_after_it(tmp_path):
    """The runner gone, the data stage's job failed while its run's job stayed queued
    after it: the rerun submitted the stage again, and re-attached to the run's job,
    which waited for the failed one (Slurm cancels it: a retry lost; or, after a job
    that completed without its work, it would start before the new one)."""
    from capsmed.pipeline.work import FAILED, JobState

    pipeline, state = _pipeline(tmp_path, lambda raw: raw.pop("analyses"))
    pipeline.stages["tupac16"].output.unlink()
    stages, runs = [pipeline.stages["tupac16"]], pipeline.runs[:1]
    first = _Cluster(pipeline.out)
    _detached_run(pipeline, state, first, runs, stages)
    second = _Cluster(pipeline.out)
    second.submitted = [("earlier", ())] * 2  # its job ids follow the first's
    second.ended["9_1"] = JobState(FAILED, "Slurm: out of memory")
    _detached_run(pipeline, state, second, runs, stages)
    assert second.cancelled == ["9_2"]
    assert second.submitted[2:] == [("stage:tupac16", ()), (f"run:{runs[0].label}",
                                                           ("9_3",))]


def test_a_run_queued_after_its_data_is_remade_keeps_its_job(tmp_path):
    """A run submitted after a data stage that makes its file again recorded the
    identity of the old file: status called its running job another run's, and a
    rerun took it for a job of other options."""
    from capsmed.pipeline.work import FINISHED, RUNNING, JobState

    pipeline, state = _pipeline(tmp_path, lambda raw: raw.pop("analyses"))
    record = state.records / "stages" / "tupac16.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"commands": "made-by-other-commands"}))
    stages, run = [pipeline.stages["tupac16"]], pipeline.runs[0]
    first = _Cluster(pipeline.out)
    _detached_run(pipeline, state, first, [run], stages)
    assert first.submitted == [("stage:tupac16", ()), (f"run:{run.label}", ("9_1",))]
    pipeline.stages["tupac16"].output.write_bytes(b"version 2")  # the stage made it
    record.unlink()
    run_id = run_identity(run)
    state.write_record(run_id, label=run.label, started=time.time() + 1)  # its job began
    second = _Cluster(pipeline.out)
    second.ended.update({"9_1": JobState(FINISHED), "9_2": JobState(RUNNING)})
    _detached_run(pipeline, state, second, [run], stages)
    assert second.cancelled == [] and second.submitted == []
    rows = {r.label: r for r in _rows(pipeline, state, lambda name, jobs: second.poll(jobs))}
    assert (rows[run.label].status, rows[run.label].run_id) == ("running", run_id)


def test_weights_copied_in_place_with_their_old_times_are_checked_again(tmp_path):
    """cp -p of another run's weights (same architecture: same size) over a verified
    checkpoint keeps its size, mtime and inode: the verified record passed it."""
    import json as json_module

    from capsmed.pipeline.verify import Verified
    from tests.pipeline_stand_ins import write_checkpoint

    records = tmp_path / "records"
    records.mkdir()
    run_dir = tmp_path / "run"
    weights = write_checkpoint(run_dir, b"weights-a")
    assert Verified(records).problem(run_dir) is None  # read once, recorded
    before = os.stat(weights)
    time.sleep(0.01)
    with weights.open("r+b") as fh:  # in place, as cp over an existing file writes
        fh.write(b"weights-b")
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(weights)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == \
        (before.st_size, before.st_mtime_ns, before.st_ino)
    assert "is damaged" in Verified(records).problem(run_dir)
    # a record made before the change time was kept still matches (no mass re-read)
    write_checkpoint(run_dir, b"weights-a")
    st = os.stat(weights)
    (records / "verified.jsonl").write_text(json_module.dumps(
        {"run": str(run_dir), "stat": [st.st_size, st.st_mtime_ns, st.st_ino]}) + "\n")
    assert Verified(records).problem(run_dir) is None


def test_a_transfer_run_whose_source_was_trained_again_trains_again(tmp_path):
    """A transfer run's identity names its source by path only: a source trained again
    in its folder (other weights) left the finished transfer run done and reused, its
    layers those of the former weights. config.yaml's transfer.weights_digest tells."""
    from capsmed.data.digest import file_digest
    from tests.pipeline_stand_ins import write_checkpoint

    source = tmp_path / "source"
    weights = write_checkpoint(source, b"weights 1")

    def transfer(raw):
        raw["train"].update(transfer_from=str(source), transfer_layers=["features"])

    pipeline, state = _pipeline(tmp_path, transfer)
    run = _run(pipeline, pipeline.runs[0].label)
    config = {"train": {**run.train}, "model_kwargs": {}, "dataset": {},
              "transfer": {"run": str(source), "epoch": 1,
                           "weights_digest": file_digest(weights)}}
    run_dir = _finished(state, run, files={"config.yaml": config})
    assert state.status(run, run_identity(run)) == "done"
    write_checkpoint(source, b"weights 2")  # the source trained again, same folder
    assert state.status(run, run_identity(run)) == "stale"
    row = next(r for r in _rows(pipeline, state) if r.run is run)
    assert row.detail == "its transfer source was trained again: trains again"
    # another task of a multi-task job, deciding before rank 0 set the folder aside,
    # joins the new training (it returned [], and rank 0's training waited for it)
    argv = execute.training_argv(state, run, run_identity(run), Placement(), prepare=False)
    assert argv[-4:-2] == ["--config", str(state.config_path(run_identity(run)))]
    assert run_dir.is_dir()
    argv = execute.training_argv(state, run, run_identity(run), Placement())
    assert argv[-4:-2] == ["--config", str(state.config_path(run_identity(run)))]
    assert not run_dir.exists() and run_dir.with_name(run_dir.name + ".stale-1").is_dir()
    # a source that is gone leaves a finished transfer run as it is
    run_dir = _finished(state, run, files={"config.yaml": config})
    weights.unlink()
    (source / "checkpoint.json").unlink()
    assert state.status(run, run_identity(run)) == "done"


def test_a_run_killed_while_it_finished_is_resumed_not_taken_as_trained(tmp_path):
    """summary.json is written before resume.pt is removed (the trackers' uploads come
    between): a run killed there was taken as trained, never finished, and evaluated
    and reported as unfinished ("trained 2 of 2 epochs"), its MLflow run left RUNNING."""
    pipeline, state = _pipeline(tmp_path)
    run = _run(pipeline, pipeline.runs[0].label)
    run_dir = _finished(state, run)
    assert state.status(run, run_identity(run)) == "done"
    (run_dir / "resume.pt").write_bytes(b"state")
    assert state.status(run, run_identity(run)) == "interrupted"
    argv = execute.training_argv(state, run, run_identity(run), Placement())
    assert argv[-2:] == ["--resume", str(run_dir)]
    assert (run_dir / "summary.json").is_file()
