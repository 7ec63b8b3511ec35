"""How the Slurm executor reads a job's end, without a cluster: stand-in squeue/sacct
answers and a stand-in submitit, as Slurm 22.05 gives them (checked on
scripts/slurm-local.sh)."""

from __future__ import annotations

import contextlib
import subprocess
from types import SimpleNamespace

import pytest

from capsmed.pipeline.executors import ExecutorSettings, executor_class
from capsmed.pipeline.resources import Resources
from capsmed.pipeline.work import WorkItem

submitit = pytest.importorskip("submitit")


class _Task:
    kind = "analysis"

    def __call__(self, placement):
        return None

    def progress(self):
        return None


def _slurm(tmp_path, monkeypatch, squeue="", sacct=""):
    from capsmed.pipeline.executors import slurm

    answers = {"squeue": squeue, "sacct": sacct, "scontrol": "", "scancel": ""}
    monkeypatch.setattr(slurm.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(
        argv, 0, answers[argv[0]], ""))
    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/usr/bin/" + name)
    executor = executor_class("slurm")(ExecutorSettings(tmp_path, "study"))
    executor.notes.mkdir(parents=True)
    return executor


class _Submitit:
    """submitit.SlurmExecutor as the executor uses it: a batch gets the ids given."""

    ids: list[str] = []

    def __init__(self, folder, max_num_timeout):
        self.handles = []

    def update_parameters(self, **params):
        pass

    @contextlib.contextmanager
    def batch(self):
        yield
        for handle, job_id in zip(self.handles, _Submitit.ids, strict=True):
            handle.job_id = job_id

    def submit(self, function):
        self.handles.append(SimpleNamespace(job_id=None))
        return self.handles[-1]


def test_a_note_of_an_earlier_job_of_the_same_id_is_not_the_new_jobs(tmp_path, monkeypatch):
    """Slurm's job ids start over (a new cluster; MaxJobId wraps): a 'finished' note an
    older job 7_0 left in the study made the new job 7_0, which failed, read as
    finished (an analysis, whose end is its job's, was taken as done)."""
    executor = _slurm(tmp_path, monkeypatch, sacct="7_0|FAILED|1:0\n7_1|COMPLETED|0:0\n")
    for job_id in ("7_0", "7_1"):
        (executor.notes / f"{job_id}.json").write_text('{"outcome": "finished"}')
    monkeypatch.setattr(submitit, "SlurmExecutor", _Submitit)
    monkeypatch.setattr(_Submitit, "ids", ["7_0", "7_1"])
    items = [WorkItem(f"analysis:{n}", n, _Task(), Resources()) for n in ("a", "b")]
    jobs = executor.submit(items, {})
    assert [j.job_id for j in jobs] == ["7_0", "7_1"]
    states = executor.poll(jobs)
    assert (states["7_0"].state, states["7_0"].reason) == ("failed", "Slurm: exit code 1")
    assert states["7_1"].state == "finished"


@pytest.mark.parametrize("sacct, reason", [
    ("5|FAILED|0:9", "Slurm: killed by signal 9"),  # kill -9: not 'exit code 0'
    ("5|FAILED|3:0", "Slurm: exit code 3"),
    ("5|CANCELLED|0:0", "Slurm: cancelled"),  # --kill-on-invalid-dep: its dependency failed
    ("5|CANCELLED by 1000|0:15", "Slurm: cancelled by uid 1000"),
    ("5|NODE_FAIL|0:0", "Slurm: node failure"),
    ("5|BOOT_FAIL|0:0", "Slurm: node failed to boot"),
    ("5|DEADLINE|0:0", "Slurm: deadline reached"),
    ("5|PREEMPTED|0:15", "Slurm: preempted"),
])
def test_each_end_slurm_accounts_for_is_named(tmp_path, monkeypatch, sacct, reason):
    from capsmed.pipeline.work import Job

    executor = _slurm(tmp_path, monkeypatch, sacct=sacct + "\n")
    state = executor.poll([Job("run:x", "slurm", "5")])["5"]
    assert (state.state, state.reason) == ("failed", reason)


def test_an_sbatch_ntasks_that_would_override_the_runs_processes_is_refused():
    """sbatch ntasks: 1 beside the --ntasks-per-node=2 of a 2-GPU run: Slurm starts one
    task (SLURM_NTASKS=1), and the run trained in one process, not data-parallel."""
    from capsmed.errors import CapsmedError
    from capsmed.pipeline.resources import check_resources

    with pytest.raises(CapsmedError, match="--ntasks is set by capsmed"):
        check_resources({"gpus": 2, "sbatch": {"ntasks": 1}}, "resources", "p.yaml")


def test_an_sbatch_time_min_that_would_shorten_the_jobs_limit_is_refused():
    """sbatch time-min lets Slurm start a job with a limit below resources.time_min,
    while the executor waits for that full limit to save and requeue: the job was
    killed at the shorter limit and the run failed instead of continuing."""
    from capsmed.errors import CapsmedError
    from capsmed.pipeline.resources import check_resources

    with pytest.raises(CapsmedError, match="--time-min is set by capsmed"):
        check_resources({"time_min": 60, "sbatch": {"time-min": 30}}, "resources", "p.yaml")


def test_a_rules_sbatch_false_removes_the_pipelines_flag(tmp_path):
    """A rule's ``sbatch: {exclusive: false}`` under a pipeline-wide ``exclusive: true``:
    the rule's runs were still submitted --exclusive (false was dropped before merging)."""
    from pathlib import Path

    import yaml

    from capsmed.pipeline.items import job_resources
    from capsmed.pipeline.spec import load_pipeline

    smoke = Path(__file__).resolve().parents[1] / "pipelines" / "smoke.yaml"
    raw = yaml.safe_load(smoke.read_text())
    raw["resources"] = {"sbatch": {"exclusive": True, "mail-type": "END"}}
    raw["rules"].append({"when": {"arch": "capsnet"},
                         "resources": {"sbatch": {"exclusive": False}}})
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    pipeline = load_pipeline(path, {"out": str(tmp_path / "out")})
    sbatch = {run.fields["arch"]: job_resources(run.resources, {}, "run", path, 0).sbatch
              for run in pipeline.runs}
    assert sbatch["capsnet"] == (("mail-type", "END"),)
    assert sbatch["lenet"] == (("exclusive", ""), ("mail-type", "END"))


def test_a_job_times_its_limit_from_slurms_end_not_from_its_own_start(tmp_path, monkeypatch):
    """The limit runs from the job's start: a process that took a minute to start (a
    shared file system) waited a minute too long to save and requeue, and was killed
    at the limit. squeue -o %e answers in the node's local time (Slurm 22.05)."""
    import time
    from datetime import datetime

    from capsmed.pipeline.executors import slurm

    ends = datetime.fromtimestamp(int(time.time()) + 300)  # 5 min left of a 60 min limit
    _slurm(tmp_path, monkeypatch, squeue=ends.isoformat() + "\n")
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    job = slurm.SlurmJob(_Task(), tmp_path, lead=60, time_min=60)
    assert job() == "done"
    assert job._ends == ends.timestamp()
    for answer in ("N/A\n", ""):  # no end Slurm can give: the process's own start
        monkeypatch.setattr(slurm.subprocess, "run", lambda argv, answer=answer, **kw:
                            subprocess.CompletedProcess(argv, 0, answer, ""))
        before = time.time()
        job()
        assert before + 3600 <= job._ends <= time.time() + 3600


@pytest.mark.parametrize("name, full", [("parti", "partition"), ("ntasks-per-n", "ntasks-per-node"),
                                        ("tim", "time")])
def test_a_short_form_of_an_option_capsmed_sets_is_refused(name, full):
    """sbatch takes an unambiguous prefix for a long option: --parti=other would have
    overridden resources.partition past the reserved names."""
    from capsmed.errors import CapsmedError
    from capsmed.pipeline.resources import check_resources

    with pytest.raises(CapsmedError, match=f"--{name} is sbatch's short form of --{full}"):
        check_resources({"sbatch": {name: "x"}}, "resources", "p.yaml")


def test_slurm_option_false_on_the_command_line_removes_a_flag():
    """--slurm-option exclusive=false went to sbatch as --exclusive=false."""
    from capsmed.cli.run import _sbatch_options
    from capsmed.pipeline.resources import build, check_resources, merge

    cli = {"sbatch": _sbatch_options(["exclusive=false", "mail-type=END"])}
    base = check_resources({"sbatch": {"exclusive": True}}, "resources", "p.yaml")
    merged = merge(base, check_resources(cli, "--slurm-option", "command line"))
    assert build(merged, "resources", "p.yaml").sbatch == (("mail-type", "END"),)


class _Sbatch(_Submitit):
    """A stand-in submitit whose sbatch refuses arrays past MaxArraySize (as Slurm's
    'Invalid job array specification') and, with ``refuse``, the Nth submission."""

    submitted: list[int] = []
    refuse: int | None = None

    @contextlib.contextmanager
    def batch(self):
        yield
        from submitit.core.utils import FailedJobError

        if len(self.handles) > 5 or len(_Sbatch.submitted) == _Sbatch.refuse:
            raise FailedJobError("sbatch: error: Batch job submission failed: Invalid "
                                 "job array specification")
        job = 10 + len(_Sbatch.submitted)
        _Sbatch.submitted.append(len(self.handles))
        for n, handle in enumerate(self.handles):
            handle.job_id = f"{job}_{n}" if len(self.handles) > 1 else str(job)


def _sbatch_executor(tmp_path, monkeypatch, refuse=None):
    from capsmed.pipeline.executors import slurm

    calls = []

    def run(argv, **kw):
        calls.append(argv)
        text = "MaxArraySize            = 5\n" if argv[0] == "scontrol" else ""
        return subprocess.CompletedProcess(argv, 0, text, "")

    monkeypatch.setattr(slurm.subprocess, "run", run)
    monkeypatch.setattr(submitit, "SlurmExecutor", _Sbatch)
    monkeypatch.setattr(_Sbatch, "submitted", [])
    monkeypatch.setattr(_Sbatch, "refuse", refuse)
    executor = executor_class("slurm")(ExecutorSettings(tmp_path, "study"))
    executor.notes.mkdir(parents=True)
    return executor, calls


def test_a_group_larger_than_max_array_size_goes_out_as_several_arrays(tmp_path, monkeypatch):
    """1100 runs of one shape were one job array past the cluster's MaxArraySize
    (1001): sbatch refused it after the data stage's job was submitted."""
    executor, _ = _sbatch_executor(tmp_path, monkeypatch)
    items = [WorkItem(f"run:r{n}", f"r{n}", _Task(), Resources()) for n in range(12)]
    jobs = executor.submit(items, {})
    assert _Sbatch.submitted == [5, 5, 2]
    assert [j.key for j in jobs] == [i.key for i in items]
    assert len({j.job_id for j in jobs}) == 12
    assert [j.job_id for j in jobs][4:6] == ["10_4", "11_0"]


def test_a_refused_submission_cancels_the_jobs_submitted_before_it(tmp_path, monkeypatch):
    """sbatch refusing the second group (a cluster limit, a bad partition) raised a
    traceback after the first group's jobs were queued; no ledger named them, so a
    rerun submitted their work again beside them (two jobs making one file)."""
    from capsmed.errors import CapsmedError

    executor, calls = _sbatch_executor(tmp_path, monkeypatch, refuse=1)
    items = [WorkItem("stage:a", "data stage 'a'", _Task(), Resources()),
             *(WorkItem(f"run:r{n}", f"r{n}", _Task(), Resources(cpus=2), ("stage:a",))
               for n in range(3))]
    with pytest.raises(CapsmedError, match=r"sbatch refused 3 job\(s\) \(r0, \.\.\.\): "
                       r"sbatch: error: .*Invalid job array.*cancelled the 1 job"):
        executor.submit(items, {})
    assert ["scancel", "10"] in calls


def test_array_tasks_cancelled_while_pending_get_their_arrays_record(tmp_path, monkeypatch):
    """Tasks of an array cancelled before they started read 'left Slurm's queue
    without an accounting record': sacct keeps them as one line of their array,
    ``13_[2-4,7%2]``, which ``sacct -j 13_2`` does not return (only ``-j 13``)."""
    from capsmed.pipeline.executors import slurm
    from capsmed.pipeline.work import Job

    records = {"13": "13_0|COMPLETED|0:0\n13_1|CANCELLED by 1000|0:15\n"
                     "13_[2-4,7%2]|CANCELLED by 1000|0:0\n", "9": "9|TIMEOUT|0:0\n"}

    def run(argv, **kw):  # sacct as Slurm 22.05 answers it: by the ids -j names
        asked = argv[argv.index("-j") + 1].split(",") if argv[0] == "sacct" else []
        return subprocess.CompletedProcess(argv, 0, "".join(records.get(a, "") for a in asked),
                                           "")

    executor = _slurm(tmp_path, monkeypatch)
    monkeypatch.setattr(slurm.subprocess, "run", run)
    ids = ["13_0", "13_1", "13_3", "13_7", "9"]
    states = executor.poll([Job(f"run:{n}", "slurm", n) for n in ids])
    assert {n: (s.state, s.reason) for n, s in states.items()} == {
        "13_0": ("finished", None), "13_1": ("failed", "Slurm: cancelled by uid 1000"),
        "13_3": ("failed", "Slurm: cancelled by uid 1000"),
        "13_7": ("failed", "Slurm: cancelled by uid 1000"),
        "9": ("failed", "Slurm: time limit reached")}


@pytest.mark.parametrize("squeue, sacct, line", [
    ("", "13|CANCELLED by 1000|0:0\n", "failed: Slurm: cancelled by uid 1000"),
    ("", "13|FAILED|2:0\n", "failed: Slurm: exit code 2"),
    ("13|PENDING|Priority\n", "", "queued, job 13, Priority"),
    ("13|RUNNING|None\n", "", "running, job 13"),
])
def test_status_asks_slurm_about_a_data_stages_job(tmp_path, monkeypatch, squeue, sacct, line):
    """``capsmed run status`` showed a data stage whose job was cancelled or failed as
    'data stage X: job 13', as if it were queued: it read the ledger only, while the
    run rows beside it asked Slurm."""
    import json
    import time
    from pathlib import Path

    import yaml

    from capsmed.pipeline.overview import study_overview
    from capsmed.pipeline.runner import RunOptions
    from capsmed.pipeline.spec import load_pipeline

    smoke = Path(__file__).resolve().parents[1] / "pipelines" / "smoke.yaml"
    raw = yaml.safe_load(smoke.read_text())
    raw["variables"]["out"] = str(tmp_path / "out")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(raw))
    pipeline = load_pipeline(tmp_path / "p.yaml")
    ledger = pipeline.out / ".capsmed-run" / "ledger.jsonl"
    ledger.parent.mkdir(parents=True)
    ledger.write_text(json.dumps({"key": "stage:tupac16", "label": "data stage tupac16",
                                  "kind": "stage", "executor": "slurm", "job": "13",
                                  "submitted": time.time()}) + "\n")
    _slurm(tmp_path, monkeypatch, squeue=squeue, sacct=sacct)
    view = study_overview(pipeline, RunOptions(executor="slurm"), dry_run=False)
    assert view.stages == [f"data stage tupac16: {line}"]
    dry = study_overview(pipeline, RunOptions(executor="slurm"), dry_run=True)
    assert dry.stages == ["data stage tupac16: job 13"]  # a dry run asks no scheduler
