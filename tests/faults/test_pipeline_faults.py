"""capsmed run's faults (issue 23): a data stage whose raw files changed is made again,
a pipeline file with a repeated key or bytes that are not UTF-8, an output folder that
cannot be written, a finished run whose weights were damaged, and a runner stopped
with SIGTERM or killed with SIGKILL (its lock and its training processes)."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from capsmed.pipeline import execute
from capsmed.pipeline.identity import run_identity
from capsmed.pipeline.spec import load_pipeline
from capsmed.pipeline.state import PipelineState
from tests.faults.common import assert_refused, invoke
from tests.pipeline_stand_ins import finish_run

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "pipelines" / "smoke.yaml"


def _pipeline(tmp_path: Path, change=None) -> Path:
    raw = yaml.safe_load(SMOKE.read_text())
    raw["variables"]["out"] = str(tmp_path / "out")
    if change:
        change(raw)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_data_stage_is_made_again_when_its_raw_files_change(tmp_path, monkeypatch):
    raw_dir = tmp_path / "raw"
    for cls, n in (("cats", 2), ("dogs", 3)):
        (raw_dir / cls).mkdir(parents=True)
        for i in range(n):
            (raw_dir / cls / f"{i}.png").write_bytes(b"x" * (i + 1))

    def change(raw):
        raw["datasets"]["tupac16"]["requires"] = [{"path": str(raw_dir), "make": "-"}]
    pipeline = load_pipeline(_pipeline(tmp_path, change))
    state, stage = PipelineState(pipeline.out), pipeline.stages["tupac16"]
    monkeypatch.setattr(execute, "run_logged", lambda argv, log, env=None: (
        stage.output.parent.mkdir(parents=True, exist_ok=True),
        stage.output.write_bytes(b"h5"))[1] and 0)
    assert execute.execute_stage(state, stage, {}) is None
    assert execute.stage_done(state, stage)
    os.rename(raw_dir / "cats", raw_dir / "tmp")  # the two class folders swapped
    os.rename(raw_dir / "dogs", raw_dir / "cats")
    os.rename(raw_dir / "tmp", raw_dir / "dogs")
    assert not execute.stage_done(state, stage)
    assert execute.remade_outputs(pipeline, state) == {str(stage.output)}
    assert execute.execute_stage(state, stage, {}) is None and execute.stage_done(state, stage)
    (raw_dir / "cats" / "0.png").write_bytes(b"other")  # a file rewritten
    assert not execute.stage_done(state, stage)


@pytest.mark.parametrize("content, text", [
    (b"name: x\nvariables:\n  epochs: 1\n  epochs: 3\ngrid: {arch: [lenet]}\n",
     "line 4: key 'epochs' is given twice"),
    (b"name: caf\xe9\ngrid: {arch: [lenet]}\n", "not UTF-8 text (byte 0xe9 on line 1)"),
    (b"name: x\ngrid: [\n", "not valid YAML"),
])
def test_a_pipeline_file_that_cannot_be_read_is_one_line(tmp_path, content, text):
    path = tmp_path / "p.yaml"
    path.write_bytes(content)
    for args in (["run", "--dry-run", path], ["run", path], ["run", "status", path]):
        assert_refused(invoke(args), path, text=text)


def test_an_output_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    path = _pipeline(tmp_path)
    out = tmp_path / "out"
    real = pathlib.Path.mkdir

    def read_only(self, *args, **kwargs):
        if str(self).startswith(str(out)):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", read_only)
    for extra in ([], ["--detach"]):  # --detach starts the runner in the background
        result = invoke(["run", path, *extra])
        assert_refused(result, out, text="cannot write the study's folder (Read-only "
                       "file system); choose another with --set out=DIR")
        assert not out.exists()


def test_a_finished_run_with_damaged_weights_is_not_done_and_trains_again(tmp_path):
    pipeline = load_pipeline(_pipeline(tmp_path))
    data = pipeline.stages["tupac16"].output
    data.parent.mkdir(parents=True)
    data.write_bytes(b"stand-in data")
    state, run = PipelineState(pipeline.out), pipeline.runs[0]
    run_dir = finish_run(state.run_dir(run, run_identity(run)))
    assert state.status(run, run_identity(run)) == "done"
    weights = run_dir / "checkpoint.safetensors"
    weights.write_bytes(weights.read_bytes()[:3])  # cut short (a full disk, a bad copy)
    fresh = PipelineState(pipeline.out)  # as a new runner reads it
    assert fresh.status(run, run_identity(run)) == "damaged"
    result = invoke(["run", "status", _pipeline(tmp_path), "--list"])
    assert "its weights are damaged: trains again" in result.output
    # another task of a multi-task job joins the training rank 0 starts again
    argv = execute.training_argv(fresh, run, run_identity(run), execute.Placement(),
                                 prepare=False)
    assert argv[-4:-2] == ["--config", str(fresh.config_path(run_identity(run)))]
    assert run_dir.is_dir()
    argv = execute.training_argv(fresh, run, run_identity(run), execute.Placement())
    assert argv[-4:-2] == ["--config", str(fresh.config_path(run_identity(run)))]
    assert not run_dir.exists() and run_dir.with_name(run_dir.name + ".damaged-1").is_dir()


def _wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _training_child(runner: int) -> int | None:
    """The pid of the runner's child that trains: its worker (capsmed.cli.worker) or
    a ``capsmed train`` process, if it runs."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == runner and (b"\0train\0" in cmdline
                                         or b"capsmed.cli.worker" in cmdline):
            return int(stat.parent.name)
    return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start_training(tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    path = _pipeline(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "capsmed", "run", str(path), "--only",
                             "arch=capsnet,condition=full,seed=0", "--set", "epochs=200"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    logs = tmp_path / "out" / "logs"
    assert _wait_for(lambda: any("INFO     epoch" in p.read_text()
                                 for p in logs.glob("tupac16-*.log")), 300)
    child = _training_child(proc.pid)
    assert child is not None
    return proc, child, tmp_path / "out"


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_sigterm_stops_the_runner_its_training_saves_and_the_lock_goes(tmp_path):
    runner, child, out = _start_training(tmp_path)
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=60) == 130
    assert not _alive(child)
    assert not (out / ".capsmed-run" / "runner.lock").exists()
    (run_dir,) = (out / "runs").iterdir()
    assert (run_dir / "resume.pt").is_file() and not (run_dir / "summary.json").exists()
    record = json.loads(next((out / ".capsmed-run" / "runs").glob("*.json")).read_text())
    assert record["outcome"] == "interrupted"


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_training_ends_promptly_when_its_runner_is_killed(tmp_path):
    runner, child, out = _start_training(tmp_path)
    saved = next((out / "runs").iterdir()) / "resume.pt"
    before = saved.stat().st_mtime_ns
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    started = time.monotonic()
    assert _wait_for(lambda: not _alive(child), 10), "the training outlived its runner"
    print(f"training ended {time.monotonic() - started:.1f} s after its runner")
    assert saved.stat().st_mtime_ns != before  # it saved its state on the way out
