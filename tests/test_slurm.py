"""capsmed run through a real Slurm cluster (scripts/slurm-local.sh in CI): the same
per-run results as the local executor. Skipped where no Slurm answers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "capsmed", "run", *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=1500)


def _results(out: Path) -> dict[str, dict]:
    """Per run (label without its identity): the test report's numbers."""
    results = {}
    for report in sorted((out / "runs").glob("*/report/report.json")):
        data = json.loads(report.read_text())
        label = report.parent.parent.name.rsplit("-", 1)[0]
        results[label] = {k: data[k] for k in ("confusion_matrix", "per_class", "accuracy")}
    return results


def test_smoke_pipeline_on_slurm_matches_the_local_executor(tmp_path):
    env = {**SLURM, "OMP_NUM_THREADS": "1"}  # the same threads in both: identical sums
    smoke = str(ROOT / "pipelines" / "smoke.yaml")
    local = _run(smoke, "--set", f"out={tmp_path / 'local'}", "--jobs", "2", env=env)
    assert local.returncode == 0, local.stdout + local.stderr
    slurm = _run(smoke, "--set", f"out={tmp_path / 'slurm'}", "--executor", "slurm",
                 "--slurm-time", "20", env=env)
    assert slurm.returncode == 0, slurm.stdout + slurm.stderr
    assert "slurm job" in slurm.stdout or "all 8 runs done" in slurm.stdout
    assert len(list((tmp_path / "slurm" / ".capsmed-run" / "slurm").iterdir())) >= 8
    ours, theirs = _results(tmp_path / "slurm"), _results(tmp_path / "local")
    assert len(ours) == 8 and ours == theirs
    again = _run(smoke, "--set", f"out={tmp_path / 'slurm'}", "--executor", "slurm", env=env)
    assert again.returncode == 0 and again.stdout.count("finished earlier") == 8


def test_slurm_example_pipeline(tmp_path):
    example = str(ROOT / "examples" / "pipeline-slurm.yaml")
    result = _run(example, "--set", f"out={tmp_path}", env=SLURM)
    assert result.returncode == 0, result.stdout + result.stderr
    study = json.loads((tmp_path / "report" / "study.json").read_text())
    assert study[0]["runs"] == 4


def test_a_requeued_job_resumes_from_its_saved_state(tmp_path):
    """Preemption: Slurm requeues a running job; the training saves resume.pt on the
    signal, the job runs again and resumes, ending as an uninterrupted run."""
    env = {**SLURM, "OMP_NUM_THREADS": "1"}
    args = [str(ROOT / "pipelines" / "smoke.yaml"), "--set", "epochs=40", "--only",
            "arch=capsnet,seed=0,condition=full"]
    out = tmp_path / "slurm"
    proc = subprocess.Popen([sys.executable, "-m", "capsmed", "run", *args, "--set",
                             f"out={out}", "--executor", "slurm"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        logs = list((out / "logs").glob("tupac16-*.log")) if (out / "logs").is_dir() else []
        if logs and "epoch 3/40" in logs[0].read_text():
            log = logs[0]
            break
        time.sleep(0.2)
    assert log is not None, "the Slurm job never started training"
    jobs = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i"], env=env,
                          capture_output=True, text=True).stdout.split()
    assert len(jobs) == 1  # the training (its analysis waits for it)
    subprocess.run(["scontrol", "requeue", jobs[0]], env=env, check=True)
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output
    text = log.read_text()
    assert "stopped (SIGTERM)" in text and "train --resume" in text
    local = _run(*args, "--set", f"out={tmp_path / 'local'}", env=env)
    assert local.returncode == 0, local.stderr
    assert _results(out) == _results(tmp_path / "local")
