"""The executor interface: every registered executor follows the protocol, a new one is
one module plus one registry line, the local executor keeps dependencies and GPU
slots, the driver retries failures with what waits for them, and the Slurm executor
maps resources to sbatch and scheduler answers to states (no cluster needed here)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.errors import CapsmedError
from capsmed.pipeline import tasks
from capsmed.pipeline.drive import Driver
from capsmed.pipeline.executors import EXECUTORS, ExecutorSettings, executor_class
from capsmed.pipeline.executors.base import Executor
from capsmed.pipeline.executors.local import LocalExecutor
from capsmed.pipeline.resources import Resources
from capsmed.pipeline.work import FAILED, FINISHED, JobState, Placement, WorkItem
from tests.pipeline_stand_ins import finish_run

SMOKE = Path(__file__).resolve().parents[1] / "pipelines" / "smoke.yaml"


@dataclass
class Note:
    """A task that records when it ran and with what; fails when told to."""

    name: str
    log: list
    fail: int = 0  # fail this many times first
    seconds: float = 0.0
    kind: ClassVar[str] = "run"
    calls: list = field(default_factory=list)

    def __call__(self, placement: Placement) -> str | None:
        self.log.append(("start", self.name, dict(placement.env)))
        time.sleep(self.seconds)
        self.log.append(("end", self.name))
        self.calls.append(1)
        return "broken" if len(self.calls) <= self.fail else None

    def progress(self) -> object:
        return None


def _item(key: str, task, after=(), gpus=None) -> WorkItem:
    return WorkItem(key, key, task, Resources(gpus=gpus), tuple(after))


def _local(tmp_path: Path, jobs: int = 2, devices=()) -> LocalExecutor:
    return LocalExecutor(ExecutorSettings(tmp_path, "t", jobs=jobs, devices=tuple(devices)))


def _drive(executor, items, retries=0):
    events = []
    driver = Driver(executor, items, retries, lambda item, st: st.reason,
                    lambda what, item, detail: events.append((what, item.key, detail)))
    driver.start()
    failures = driver.wait(refresh=0.05)
    executor.close()
    return failures, events


@pytest.mark.parametrize("name", list(EXECUTORS))
def test_every_registered_executor_follows_the_protocol(tmp_path, name):
    cls = executor_class(name)
    executor = cls(ExecutorSettings(tmp_path, "t", devices=()))
    assert isinstance(executor, Executor) and cls.name == name
    assert isinstance(cls.OPTIONS, frozenset) and isinstance(cls.detached, bool)


def test_an_unknown_executor_is_one_line(tmp_path):
    with pytest.raises(CapsmedError, match="--executor must be one of local, slurm, got 'lokal'"):
        executor_class("lokal")


def test_local_jobs_wait_for_their_dependencies_and_share_gpus(tmp_path):
    log: list = []
    stage = Note("stage", log, seconds=0.2)
    items = [_item("stage", stage),
             _item("a", Note("a", log, seconds=0.2), after=["stage"], gpus=1),
             _item("b", Note("b", log, seconds=0.2), after=["stage"], gpus=1),
             _item("both", Note("both", log), after=["a"], gpus=2)]
    failures, events = _drive(_local(tmp_path, jobs=2, devices=["0", "1"]), items)
    assert failures == {}
    order = [(what, name) for what, name, *_ in log]
    assert order.index(("end", "stage")) < order.index(("start", "a"))
    assert order.index(("end", "a")) < order.index(("start", "both"))
    gpus = {name: env.get("CUDA_VISIBLE_DEVICES") for what, name, *rest in log
            if what == "start" for env in rest}
    assert {gpus["a"], gpus["b"]} == {"0", "1"} and gpus["both"] == "0,1"
    assert gpus["stage"] is None  # a job that asks for no GPU count keeps the machine's
    assert [e[:2] for e in events if e[0] == "done"][-1] == ("done", "both")


def test_a_failure_is_retried_with_what_waits_for_it_then_given_up(tmp_path):
    log: list = []
    flaky, after = Note("flaky", log, fail=1), Note("after", log)
    failures, _ = _drive(_local(tmp_path), [_item("flaky", flaky),
                                            _item("after", after, after=["flaky"])],
                         retries=1)
    assert failures == {} and len(flaky.calls) == 2 and len(after.calls) == 1
    log.clear()
    broken, waits = Note("broken", log, fail=5), Note("waits", log)
    failures, events = _drive(_local(tmp_path), [_item("broken", broken),
                                                 _item("waits", waits, after=["broken"])],
                              retries=1)
    assert failures == {"broken": "broken", "waits": "needs broken, which failed"}
    assert len(broken.calls) == 2 and not waits.calls  # never run
    assert ("failed", "waits", "needs broken, which failed") in events


def test_the_local_executor_refuses_what_this_machine_cannot_give(tmp_path):
    executor = _local(tmp_path, devices=["0"])
    with pytest.raises(CapsmedError, match="asks for 2 GPU.*this machine gives 1 "
                                           r"\(--gpus 0\)"):
        executor.check([_item("big", Note("big", []), gpus=2)])
    with pytest.raises(CapsmedError, match="asks for 2 nodes"):
        executor.check([WorkItem("wide", "wide", Note("w", []), Resources(nodes=2))])


def test_runs_per_gpu_shares_each_gpu_spreading_jobs_first(tmp_path):
    """``runs_per_gpu: 2`` on two GPUs: four one-GPU jobs at once, the first two on
    different GPUs, never more than two on one; a two-GPU job gets two distinct ones."""
    lock, on, peak, starts = threading.Lock(), {"0": 0, "1": 0}, {"0": 0, "1": 0}, []
    both_started = threading.Barrier(4, timeout=30)

    @dataclass
    class Holder(Note):
        def __call__(self, placement):
            devices = placement.env["CUDA_VISIBLE_DEVICES"].split(",")
            with lock:
                starts.append((self.name, devices))
                for d in devices:
                    on[d] += 1
                    peak[d] = max(peak[d], on[d])
            if len(devices) == 1:
                both_started.wait()  # all four run at once, or this times out
            with lock:
                for d in devices:
                    on[d] -= 1
            return None

    executor = LocalExecutor(ExecutorSettings(tmp_path, "t", devices=("0", "1"),
                                              options={"runs_per_gpu": 2}))
    assert executor.jobs == 4
    items = [_item(k, Holder(k, []), gpus=1) for k in "abcd"]
    items.append(_item("pair", Holder("pair", []), after="abcd", gpus=2))
    failures, _ = _drive(executor, items)
    assert failures == {}
    placed = dict(starts)  # by job: the threads may start in any order
    assert placed["a"] != placed["b"]  # the first two are spread before any is shared
    assert peak == {"0": 2, "1": 2} and placed["pair"] == ["0", "1"]
    for bad in (0, "2", True):
        with pytest.raises(CapsmedError, match="runs_per_gpu: expected a whole number"):
            LocalExecutor(ExecutorSettings(tmp_path, "t", devices=(),
                                           options={"runs_per_gpu": bad}))


def test_runs_per_gpu_from_the_command_line_is_for_the_local_executor(tmp_path):
    from capsmed.pipeline.runner import RunOptions, executor_for
    from capsmed.pipeline.spec import load_pipeline

    pipeline = load_pipeline(SMOKE, {"out": str(tmp_path / "out")})
    local = executor_for(pipeline, RunOptions(runs_per_gpu=3, gpus=["0"]))
    assert local.runs_per_gpu == 3 and local.jobs == 2  # smoke.yaml's jobs: 2 still rule
    assert executor_for(pipeline, RunOptions(runs_per_gpu=3, gpus=["0"], jobs=9)).jobs == 9
    with pytest.raises(CapsmedError, match="--runs-per-gpu is for the local executor, "
                                           "not slurm"):
        executor_for(pipeline, RunOptions(runs_per_gpu=2, executor="slurm"))


def test_gpus_named_twice_or_not_as_numbers_are_refused(tmp_path):
    """``--gpus 0,0`` gave a run of two GPUs CUDA_VISIBLE_DEVICES=0,0; the YAML's
    ``gpus: "0,1"`` was read letter by letter (a GPU named ','), ``jobs: -1`` hung."""
    from capsmed.pipeline.runner import RunOptions, executor_for
    from capsmed.pipeline.spec import load_pipeline

    pipeline = load_pipeline(SMOKE, {"out": str(tmp_path / "out")})
    with pytest.raises(CapsmedError, match=r"--gpus: GPU 0 named more than once \('0,1,0'\)"):
        executor_for(pipeline, RunOptions(gpus=["0", "1", "0"]))
    with pytest.raises(CapsmedError, match="GPU 1 named more than once"):
        executor_for(pipeline, RunOptions(gpus=["1", "01"]))

    def with_executor(**section):
        raw = yaml.safe_load(SMOKE.read_text())
        raw["executor"] = section
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump(raw))
        return load_pipeline(path, {"out": str(tmp_path / "out")})

    assert executor_for(with_executor(gpus="0,1"), RunOptions()).settings.devices == ("0", "1")
    for gpus, text in (([0, 0], "executor.gpus: GPU 0 named more than once"),
                       (1, "executor.gpus: expected a list of GPU numbers"),
                       (0, "executor.gpus: expected a list of GPU numbers"),
                       (["a"], "executor.gpus: expected GPU numbers")):
        with pytest.raises(CapsmedError, match=text):
            executor_for(with_executor(gpus=gpus), RunOptions())
    for jobs in (-1, 0, 2.5):
        with pytest.raises(CapsmedError, match="executor.jobs must be a whole number >= 1"):
            executor_for(with_executor(jobs=jobs), RunOptions())


def test_an_empty_gpu_list_is_no_gpu_in_the_yaml_as_on_the_command_line(tmp_path,
                                                                       monkeypatch):
    """``--gpus ''`` gave the local executor no GPU, while ``executor.gpus: []`` gave
    it every visible one; a run asking for a GPU was then refused as if the machine
    had none."""
    from capsmed.pipeline import runner
    from capsmed.pipeline.executors import local
    from capsmed.pipeline.spec import load_pipeline

    monkeypatch.setattr(local, "visible_gpus", lambda: ["0", "1"])
    raw = yaml.safe_load(SMOKE.read_text())
    raw["executor"] = {"gpus": []}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    pipeline = load_pipeline(path, {"out": str(tmp_path / "out")})
    from_yaml = runner.executor_for(pipeline, runner.RunOptions())
    assert from_yaml.devices == [] == runner.executor_for(
        pipeline, runner.RunOptions(gpus=[])).devices
    del raw["executor"]["gpus"]  # left out: every visible GPU
    path.write_text(yaml.safe_dump(raw))
    assert runner.executor_for(load_pipeline(path, {"out": str(tmp_path / "out")}),
                               runner.RunOptions()).devices == ["0", "1"]
    run = pipeline.runs[0]
    run.resources["gpus"] = 1
    with pytest.raises(CapsmedError, match="would get none: executor.gpus gives 0"):
        runner.check_gpus(pipeline, [run], runner.RunOptions(), from_yaml)


@pytest.mark.parametrize(("visible", "seen"), [("-1", []), ("0,-1,1", ["0"]),
                                               ("0, 1", ["0", "1"]), ("", [])])
def test_visible_gpus_end_where_cuda_stops_reading(monkeypatch, visible, seen):
    """CUDA_VISIBLE_DEVICES=-1 hides every GPU: it counted as one, so runs that ask
    for a GPU were placed on '-1' and trained on the CPU without a word."""
    from capsmed.pipeline.executors.local import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_gpus() == seen


def test_a_local_job_of_a_dead_runner_reads_as_ended(tmp_path):
    from capsmed.pipeline.work import Job

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    import socket

    state = _local(tmp_path).poll([Job("run:x", "local", f"{socket.gethostname()}:"
                                                          f"{proc.pid}:3")])
    assert state[f"{socket.gethostname()}:{proc.pid}:3"].state == FAILED


INLINE = '''
"""A toy executor: runs each job at once, in this process."""
from capsmed.pipeline.work import FINISHED, FAILED, Job, JobState, Placement

class InlineExecutor:
    name = "inline"
    OPTIONS = frozenset({"greeting"})
    detached = False
    refresh_seconds = 0.0
    seen = []

    def __init__(self, settings):
        self.settings, self.states = settings, {}

    def check(self, items):
        pass

    def gpus_available(self):
        return 0

    def submit(self, items, placed):
        jobs = []
        for item in items:
            job = Job(item.key, self.name, str(len(self.seen)))
            assert all(k in placed or k in {j.key for j in jobs} for k in item.after)
            InlineExecutor.seen.append((item.key, self.settings.options.get("greeting")))
            reason = item.task(Placement())
            self.states[job.job_id] = JobState(FINISHED if reason is None else FAILED, reason)
            jobs.append(job)
        return jobs

    def poll(self, jobs):
        return {j.job_id: self.states[j.job_id] for j in jobs}

    def cancel(self, jobs):
        pass

    def close(self, interrupted=False):
        pass
'''


def test_a_new_executor_is_one_module_and_one_registry_line(tmp_path, monkeypatch):
    (tmp_path / "toy_executor.py").write_text(INLINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(EXECUTORS, "inline", "toy_executor:InlineExecutor")  # the line
    raw = yaml.safe_load(SMOKE.read_text())
    raw["variables"]["out"] = str(tmp_path / "out")
    raw["executor"] = {"kind": "inline", "inline": {"greeting": "hello"}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))

    def make(state, stage, env, persistent=False):
        stage.output.parent.mkdir(parents=True, exist_ok=True)
        stage.output.write_bytes(b"data")

    def train(state, run, run_id, placement):
        finish_run(state.run_dir(run, run_id))

    monkeypatch.setattr(tasks, "execute_stage", make)
    monkeypatch.setattr(tasks, "execute_run", train)
    monkeypatch.setattr(tasks, "execute_analysis", lambda *a: None)
    result = CliRunner().invoke(app, ["run", str(path), "--no-report"])
    assert result.exit_code == 0, result.output
    seen = __import__("toy_executor").InlineExecutor.seen
    assert [k for k, _ in seen][:2] == ["stage:tupac16", "run:tupac16-capsnet-full-seed0"]
    assert len(seen) == 11 and {g for _, g in seen} == {"hello"}  # 1 + 8 + 2 analyses


def test_an_executor_section_names_only_registered_executors(tmp_path):
    from capsmed.pipeline.spec import load_pipeline

    raw = yaml.safe_load(SMOKE.read_text())
    for section, message in (({"slurm": {"partition": "gpu"}}, "executor.slurm: unknown "
                              "option(s) partition"), ({"ray": {}}, "unknown key(s) ray"),
                             ({"kind": "lokal"}, "executor.kind must be one of")):
        raw["executor"] = section
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump(raw))
        with pytest.raises(CapsmedError, match=message.replace("(", r"\(").replace(
                ")", r"\)")):
            load_pipeline(path)


# -- the Slurm executor without a cluster ---------------------------------------------------
def _slurm(tmp_path, **options):
    return executor_class("slurm")(ExecutorSettings(tmp_path, "study", jobs=8,
                                                    options=options))


def test_resources_become_sbatch_parameters(tmp_path):
    res = Resources(gpus=4, nodes=2, cpus=8, mem_gb=32, time_min=120, partition="gpu",
                    account="lab", qos="high", constraint="a100",
                    sbatch=(("exclusive", ""), ("mail-type", "END")))
    params = _slurm(tmp_path)._parameters(res, ["12_3", "14"])
    assert params["gpus_per_node"] == 2 and params["ntasks_per_node"] == 2
    assert params["nodes"] == 2 and params["cpus_per_task"] == 8 and params["mem"] == "32768MB"
    assert params["time"] == 120 and params["signal_delay_s"] == 120
    assert (params["partition"], params["account"], params["qos"], params["constraint"]) == (
        "gpu", "lab", "high", "a100")
    extra = params["additional_parameters"]
    assert extra == {"exclusive": True, "mail-type": "END", "dependency": "afterok:12_3:14",
                     "kill_on_invalid_dep": "yes"}
    assert params["array_parallelism"] == 8 and params["job_name"] == "capsmed-study"


@pytest.mark.parametrize("lead, time_min, message", [
    (90, 1, "signal_lead_s 90 does not fit a 1 min time limit"),
    (5, 60, "leaves no time to save"),
    (None, 1, None), (30, 1, None), (120, 1440, None)])
def test_a_signal_lead_that_does_not_fit_the_time_limit_is_refused(tmp_path, monkeypatch,
                                                                   lead, time_min, message):
    from capsmed.pipeline.executors import slurm

    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/usr/bin/" + name)
    options = {} if lead is None else {"signal_lead_s": lead}
    item = WorkItem("run:x", "x", Note("x", []), Resources(time_min=time_min))
    if message is None:
        _slurm(tmp_path, **options).check([item])
    else:
        with pytest.raises(CapsmedError, match=message):
            _slurm(tmp_path, **options).check([item])


def test_one_squeue_and_one_sacct_answer_for_every_job(tmp_path, monkeypatch):
    from capsmed.pipeline.executors import slurm
    from capsmed.pipeline.work import Job

    calls = []
    answers = {"squeue": "7_0|RUNNING|None\n7_1|PENDING|Priority\n",
               "sacct": "7_2|TIMEOUT|0:0\n7_3|CANCELLED by 0|0:0\n7_4|FAILED|2:0\n"
                        "7_5|COMPLETED|0:0\n7_6|OUT_OF_MEMORY|0:125\n"}

    def fake_run(argv, **kwargs):
        calls.append(argv[0])
        return subprocess.CompletedProcess(argv, 0, answers[argv[0]], "")

    monkeypatch.setattr(slurm.subprocess, "run", fake_run)
    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/usr/bin/" + name)
    executor = _slurm(tmp_path)
    executor.notes.mkdir(parents=True)
    (executor.notes / "7_7.json").write_text('{"outcome": "failed", "reason": "no progress"}')
    jobs = [Job(f"k{i}", "slurm", f"7_{i}") for i in range(8)]
    states = executor.poll(jobs)
    assert calls == ["squeue", "sacct"]
    assert [(s.state, s.reason) for s in states.values()] == [
        ("running", None), ("queued", "Priority"), ("failed", "Slurm: time limit reached"),
        ("failed", "Slurm: cancelled by uid 0"), ("failed", "Slurm: exit code 2"),
        ("finished", None), ("failed", "Slurm: out of memory"), ("failed", "no progress")]


def test_the_driver_asks_the_executor_once_per_refresh(tmp_path):
    class Counting(LocalExecutor):
        polls = 0

        def poll(self, jobs):
            Counting.polls += 1
            return super().poll(jobs)

    log: list = []
    items = [_item(f"r{i}", Note(f"r{i}", log, seconds=0.1)) for i in range(6)]
    executor = Counting(ExecutorSettings(tmp_path, "t", jobs=3, devices=()))
    driver = Driver(executor, items, 0, lambda item, st: st.reason, lambda *a: None)
    driver.start()
    driver.refresh()
    assert Counting.polls == 1
    driver.wait(refresh=0.05)
    executor.close()
    assert all(t.done for t in driver.tracked.values())


def test_cancelled_local_jobs_never_start(tmp_path):
    log: list = []
    gate = threading.Event()

    @dataclass
    class Blocker(Note):
        def __call__(self, placement):
            gate.wait(5)
            return None

    executor = _local(tmp_path, jobs=1)
    jobs = executor.submit([_item("first", Blocker("first", log)),
                            _item("second", Note("second", log))], {})
    executor.cancel(jobs[1:])
    gate.set()
    executor.close()
    assert executor.poll(jobs)[jobs[1].job_id] == JobState(FAILED, "cancelled")
    assert executor.poll(jobs)[jobs[0].job_id] == JobState(FINISHED)
    assert not log
