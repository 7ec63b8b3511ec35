"""capsmed run through a real Slurm cluster (scripts/slurm-local.sh in CI, with slurmdbd
so that sacct answers): the same per-run results as the local executor, runs that
outlive 1-minute time limits and requeues bit-identically, a killed runner that is
re-attached instead of duplicating jobs, --detach then wait from another folder, a
cancelled job reported with its reason, and a run trained by two Slurm tasks (gloo).
Skipped where no Slurm answers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "pipelines" / "smoke.yaml"
LOCAL_CONF = Path(os.environ.get("SLURM_LOCAL_DIR", "/tmp/capsmed-slurm")) / "slurm.conf"


def _slurm_env() -> dict[str, str] | None:
    env = dict(os.environ)
    if "SLURM_CONF" not in env and LOCAL_CONF.is_file():
        env["SLURM_CONF"] = str(LOCAL_CONF)
    if shutil.which("sinfo") is None:
        return None
    try:
        ok = subprocess.run(["sinfo", "-h"], env=env, capture_output=True, timeout=20)
    except subprocess.TimeoutExpired:
        return None
    return env if ok.returncode == 0 else None


SLURM = _slurm_env()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SLURM is None, reason="no Slurm cluster answers (start "
                                 "one with scripts/slurm-local.sh start)")]
# the same threads everywhere (same sums), and this checkout's capsmed from any folder
ENV = {**(SLURM or {}), "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _run(*args: str, env: dict[str, str] = ENV, cwd: Path = ROOT
         ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "capsmed", "run", *args], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=1500)


def _results(out: Path) -> dict[str, dict]:
    """Per run (label without its identity): the test report's numbers."""
    results = {}
    for report in sorted((out / "runs").glob("*/report/report.json")):
        data = json.loads(report.read_text())
        label = report.parent.parent.name.rsplit("-", 1)[0]
        results[label] = {k: data[k] for k in ("confusion_matrix", "per_class", "accuracy")}
    return results


def _study(tmp_path: Path, name: str, **changes) -> Path:
    """The smoke study under a name of its own (its Slurm jobs are capsmed-NAME)."""
    raw = yaml.safe_load(SMOKE.read_text())
    raw.update(name=name, analyses=[], **changes)
    raw["report"]["tables"] = raw["report"]["tables"][:1]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _sacct(name: str, *fields: str, duplicates: bool = False) -> list[list[str]]:
    argv = ["sacct", "-n", "-P", "-X", "--name", f"capsmed-{name}", "-o", ",".join(fields)]
    out = subprocess.run(argv + (["-D"] if duplicates else []), env=ENV,
                         capture_output=True, text=True, check=True).stdout
    return [line.split("|") for line in out.splitlines() if line.strip()]


def _ledger(out: Path) -> dict[str, str]:
    jobs = {}
    for line in (out / ".capsmed-run" / "ledger.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if "submitted" in entry:
            jobs[entry["key"]] = entry["job"]
    return jobs


def _weights(out: Path) -> str:
    (meta,) = (out / "runs").glob("*/checkpoint.json")
    return json.loads(meta.read_text())["weights_digest"]


def test_smoke_pipeline_on_slurm_matches_the_local_executor(tmp_path):
    smoke = str(SMOKE)
    local = _run(smoke, "--set", f"out={tmp_path / 'local'}", "--jobs", "2")
    assert local.returncode == 0, local.stdout + local.stderr
    slurm = _run(smoke, "--set", f"out={tmp_path / 'slurm'}", "--executor", "slurm",
                 "--slurm-time", "20")
    assert slurm.returncode == 0, slurm.stdout + slurm.stderr
    assert "slurm job" in slurm.stdout
    ours, theirs = _results(tmp_path / "slurm"), _results(tmp_path / "local")
    assert len(ours) == 8 and ours == theirs
    again = _run(smoke, "--set", f"out={tmp_path / 'slurm'}", "--executor", "slurm")
    assert again.returncode == 0 and "8 of 8 runs finished earlier" in again.stdout


def test_slurm_example_pipeline(tmp_path):
    example = str(ROOT / "examples" / "pipeline-slurm.yaml")
    result = _run(example, "--set", f"out={tmp_path}", env=SLURM)
    assert result.returncode == 0, result.stdout + result.stderr
    study = json.loads((tmp_path / "report" / "study.json").read_text())
    assert study["tables"][0]["runs"] == 4


def _wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def _state(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=ENV,
                          capture_output=True, text=True).stdout.strip()


def _timed_out(out: Path) -> bool:
    """submitit requeued a job of ``out`` at Slurm's time-limit warning."""
    logs = (out / ".capsmed-run" / "slurm").glob("*/*_log.*")  # submitit logs to both
    text = "".join(p.read_text() for p in logs)
    return "this job is timed-out" in text and "Requeued job" in text


def _log_text(out: Path) -> str:
    logs = list((out / "logs").glob("tupac16-*.log")) if (out / "logs").is_dir() else []
    return logs[0].read_text() if logs else ""


def test_a_run_requeued_five_times_ends_bit_identical(tmp_path):
    """1-minute time limits (Slurm's SIGUSR2, exact state saved mid-epoch, submitit
    requeues) and preemptions (scontrol requeue): at least 5 requeues in sacct, and
    the weights of an uninterrupted run."""
    name = f"requeue-{os.getpid()}"  # its own jobs in sacct, however often it runs
    raw = yaml.safe_load(SMOKE.read_text())  # the run's limit: 1 min (not its data's)
    path = _study(tmp_path, name, resources={"cpus": 1}, rules=[
        *raw["rules"], {"when": {"arch": "capsnet"}, "resources": {"time_min": 1}}],
        train={**raw["train"], "patience": None},  # all 300 epochs: several windows
        executor={"slurm": {"signal_lead_s": 25, "poll_s": 2}})
    args = [str(path), "--set", "epochs=300", "--only", "arch=capsnet,seed=0,condition=full"]
    out = tmp_path / "slurm"
    started = _run(*args, "--set", f"out={out}", "--executor", "slurm", "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    job = _ledger(out)["run:tupac16-capsnet-full-seed0"]
    preempted, seen = 0, ""
    deadline = time.monotonic() + 1500
    while time.monotonic() < deadline and not list((out / "runs").glob("*/summary.json")):
        text = _log_text(out)
        trained = text.count("INFO     epoch") - seen.count("INFO     epoch")
        requeues = [r[1] for r in _sacct(name, "JobID", "State", duplicates=True)
                    if r[0] == job].count("REQUEUED")
        if _timed_out(out) and requeues < 5 and trained >= 2 and _state(job) == "RUNNING":
            # once a time limit has requeued it: preemptions, after progress each time
            subprocess.run(["scontrol", "requeue", job], env=ENV, check=True)
            preempted, seen = preempted + 1, text
        time.sleep(2)
    waited = _run("wait", *args, "--set", f"out={out}", cwd=tmp_path)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    # the accounting database may lag behind, and a time limit that requeued the job
    # as training finished leaves it PENDING until Slurm's requeue delay has passed and
    # it has run again (finding the run finished): seen once at 30 s under load
    for _ in range(180):
        states = [row[1] for row in _sacct(name, "JobID", "State", duplicates=True)
                  if row[0] == job]
        if states[-1:] == ["COMPLETED"]:
            break
        time.sleep(1)
    assert states.count("REQUEUED") >= 5 and states[-1] == "COMPLETED", states
    assert _timed_out(out)  # at least one window ended by its 1-minute limit
    assert "resuming" in _log_text(out)
    local = _run(*args, "--set", f"out={tmp_path / 'local'}")
    assert local.returncode == 0, local.stderr
    assert _weights(out) == _weights(tmp_path / "local")


def test_a_killed_runner_is_re_attached_and_a_cancelled_job_named(tmp_path):
    """kill -9 with the array queued, then --detach: no duplicate jobs; wait from another
    folder; scancel of one job: status gives the reason and a rerun finishes it."""
    name = f"attach-{os.getpid()}"
    path = _study(tmp_path, name, executor={"kind": "slurm", "slurm": {"poll_s": 2}})
    out = tmp_path / "out"
    args = [str(path), "--set", f"out={out}", "--only", "arch=lenet"]
    runner = subprocess.Popen([sys.executable, "-m", "capsmed", "run", *args], cwd=ROOT,
                              env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not any(
            k.startswith("run:") for k in (_ledger(out) if (
                out / ".capsmed-run" / "ledger.jsonl").is_file() else {})):
        time.sleep(0.2)
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    assert len([k for k in _ledger(out) if k.startswith("run:")]) == 4
    detached = _run(*args, "--detach")
    assert detached.returncode == 0, detached.stdout + detached.stderr
    assert "re-attached to" in detached.stdout and "submitted 0 job(s)" in detached.stdout
    victim = _ledger(out)["run:tupac16-lenet-half-seed1"]
    assert _wait_for(lambda: _state(victim) == "RUNNING", 300)  # sacct then knows it
    subprocess.run(["scancel", victim], env=ENV, check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    waited = _run("wait", str(path), "--set", f"out={out}", "--only", "arch=lenet",
                  cwd=elsewhere)
    assert waited.returncode == 1 and "cancelled" in waited.stdout, waited.stdout
    assert len(_sacct(name, "JobID")) == 5  # 1 data stage + 4 runs: nothing twice
    status = _run("status", str(path), "--set", f"out={out}", "--only", "arch=lenet",
                  cwd=elsewhere)
    assert "(3 finished, 1 failed)" in status.stdout, status.stdout
    assert "tupac16-lenet-half-seed1: Slurm: cancelled by uid" in status.stdout
    again = _run(*args, cwd=elsewhere)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3 of 4 runs finished earlier" in again.stdout
    assert len(_sacct(name, "JobID")) == 6 and (out / "report" / "study.md").is_file()


def test_two_slurm_tasks_train_one_run_data_parallel(tmp_path):
    """resources.tasks 2: submitit starts two tasks that join one gloo process group;
    the result is the local executor's (two torchrun processes)."""
    name = f"ddp-{os.getpid()}"
    path = _study(tmp_path, name, resources={"tasks": 2, "cpus": 1})
    args = [str(path), "--only", "arch=lenet,condition=full,seed=0"]
    slurm = _run(*args, "--set", f"out={tmp_path / 'slurm'}", "--executor", "slurm")
    assert slurm.returncode == 0, slurm.stdout + slurm.stderr
    local = _run(*args, "--set", f"out={tmp_path / 'local'}")
    assert local.returncode == 0, local.stdout + local.stderr
    text = _log_text(tmp_path / "slurm")
    assert "rank 1 of 2" in text and "rank 0 of 2" in text
    assert _weights(tmp_path / "slurm") == _weights(tmp_path / "local")
