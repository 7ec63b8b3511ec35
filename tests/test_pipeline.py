"""capsmed run: grid expansion, run identity, resume after SIGKILL, failures, status."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.errors import CapsmedError
from capsmed.pipeline.runner import select_runs
from capsmed.pipeline.spec import load_pipeline

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "pipelines" / "smoke.yaml"
runner = CliRunner()


def _pipeline(tmp_path: Path, **changes) -> Path:
    raw = yaml.safe_load(SMOKE.read_text())
    raw["variables"]["out"] = str(tmp_path / "out")
    raw.update(changes)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _capsmed_run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "capsmed", "run", *args], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=900)


def test_grid_expands_with_rules_selection_and_variables(tmp_path, monkeypatch):
    p = load_pipeline(SMOKE, {"epochs": 3})
    assert len(p.runs) == 8
    run = next(r for r in p.runs if r.label == "tupac16-capsnet-half-seed1")
    assert run.fields == {"dataset": "tupac16", "arch": "capsnet", "condition": "half",
                          "seed": 1}
    assert run.train["fraction"] == 0.5 and run.train["epochs"] == 3  # typed, from --set
    assert run.train["model_kwargs"]["conv_channels"] == 16 and run.train["seed"] == 1
    assert run.train["data"] == str(p.out / "data" / "tupac16.h5")
    assert "fraction" not in next(r for r in p.runs if r.fields["condition"] == "full").train
    assert len(select_runs(p, ["arch=capsnet,seed=0"], [])) == 2
    assert len(select_runs(p, [], ["condition=half", "arch=lenet"])) == 2
    assert len(select_runs(p, [], ["condition=half,arch=lenet"])) == 6  # both must match
    assert len(select_runs(p, ["arch=capsnet", "arch=lenet", "seed=1"], [])) == 4
    monkeypatch.setenv("CAPSMED_EPOCHS", "4")
    assert load_pipeline(SMOKE).runs[0].train["epochs"] == 4  # the environment
    with pytest.raises(CapsmedError, match="unknown field"):
        select_runs(p, ["archh=capsnet"], [])
    with pytest.raises(CapsmedError, match="unknown variable"):
        load_pipeline(SMOKE, {"data_rot": "x"})


@pytest.mark.parametrize("only, exclude, message", [
    (["seed=0", "seed=7"], [], "--only: seed has no value 7 on the grid (its values: 0, 1)"),
    ([], ["arch=lenett"], "--exclude: arch has no value lenett on the grid"),
    ([], ["seed=0,arch=lenett"], "--exclude: arch has no value lenett"),
])
def test_a_selection_value_the_grid_lacks_is_refused(only, exclude, message):
    """A misspelt value kept fewer runs than asked (seed=7 beside seed=0), or dropped
    none (--exclude arch=lenett trained the runs it was to leave out), exiting 0."""
    with pytest.raises(CapsmedError, match=re.escape(message)):
        select_runs(load_pipeline(SMOKE), only, exclude)


GRID_WITHOUT_HALF_CAPSNET = [  # each field's values exist; one combination does not
    {"dataset": ["tupac16"], "arch": ["lenet"], "condition": ["full", "half"], "seed": [0, 1]},
    {"dataset": ["tupac16"], "arch": ["capsnet"], "condition": ["full"], "seed": [0, 1]}]


@pytest.mark.parametrize("change, message", [
    ({"trian": {}}, "unknown key(s) trian"),
    ({"rules": [{"set": {"epochz": 2}}]}, "unknown training option(s) epochz"),
    ({"train": {"epochs": "{epoch}"}}, "unknown variable '{epoch}'"),
    ({"grid": []}, "'grid' is empty"),
    ({"report": {"tables": [{"rows": "condition", "columns": "archh"}]}},
     "columns must be a grid field"),
    ({"report": {"tables": [{"rows": "condition", "columns": "arch", "metrc": "x"}]}},
     "unknown key(s) metrc"),
    ({"report": {"tables": [{"rows": "condition", "columns": "arch",
                             "paper": {"ful": {"lenet": 0.9}}}]}},
     "report.tables[0].paper: 'ful' is not a row of the table (its rows: full, half)"),
    ({"report": {"tables": [{"rows": "condition", "columns": "arch",
                             "paper": {"full": {"lenet": 99.5}}}]}},
     "99.5 is above 1, but the table's metric is a fraction (0-1): give scale: 100"),
    ({"report": {"tables": [{"rows": "condition", "columns": "arch", "scale": 100,
                             "paper": {"full": {"lenet": 0.995}}}]}},
     "every number is at most 1, but scale: 100 shows percentages"),
    ({"report": {"tables": [{"rows": "condition", "columns": "arch",
                             "paper": {"full": {"lenet": float("nan")}}}]}},
     "report.tables[0].paper.full: expected numbers, got nan"),
    ({"report": {"tables": [{"rows": "condition", "columns": "arch",
                             "curve": {"x": {"full": 100, "half": 0}}}]}},
     "report.tables[0].curve.x: row half is at 0, which a log axis cannot show"),
    ({"report": {"tables": [{"rows": "dataset", "columns": "arch"}]}},
     "report.tables[0]: cell tupac16 / capsnet pools runs of condition full, half as if "
     "they were repetitions"),
    ({"report": {"tables": [{"kind": "per_class", "where": {"arch": "capsnet"}}]}},
     "the table pools runs of condition full, half"),
    ({"grid": GRID_WITHOUT_HALF_CAPSNET, "exclude": [{"arch": "capsnet", "condition": "half"}]},
     "exclude[0]: {'arch': 'capsnet', 'condition': 'half'} matches no run of the grid"),
    ({"grid": GRID_WITHOUT_HALF_CAPSNET, "rules": [
        {"when": {"arch": "capsnet", "condition": "half"}, "set": {"epochs": 2}}]},
     "rules[0].when: {'arch': 'capsnet', 'condition': 'half'} matches no run of the grid"),
])
def test_bad_pipeline_files_are_one_line_errors(tmp_path, change, message):
    result = runner.invoke(app, ["run", "--dry-run", str(_pipeline(tmp_path, **change))])
    assert result.exit_code == 1 and message in result.stderr, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("setting, message", [
    ("out=", "variable 'out' is empty: give the output folder"),
    ("out=''", "variable 'out' is empty"),
    ("epochs=", "run tupac16-capsnet-full-seed0: 'x{epochs}': '{epochs}' is null (empty) "
                "and would be written as None"),
])
def test_a_null_variable_is_refused_not_written_as_none(tmp_path, monkeypatch, setting,
                                                        message):
    """--set out=$UNSET wrote the whole study into ./None; a null inside a longer string
    (a path, an option) became the word None."""
    monkeypatch.chdir(tmp_path)
    path = _pipeline(tmp_path, rules=[{"set": {"mlflow_experiment": "x{epochs}",
                                               "mlflow": "file:/tmp/x"}}])
    result = runner.invoke(app, ["run", "--dry-run", "--allow-cpu", str(path),
                                 "--set", setting])
    assert result.exit_code == 1 and message in result.stderr, result.output
    assert not (tmp_path / "None").exists()


def test_two_data_stages_may_not_make_one_file(tmp_path):
    raw = yaml.safe_load(SMOKE.read_text())
    raw["datasets"]["again"] = {**raw["datasets"]["tupac16"],
                                "output": "{out}/data/../data/tupac16.h5"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    result = runner.invoke(app, ["run", "--dry-run", str(path)])
    assert result.exit_code == 1
    assert "datasets.again.output:" in result.stderr
    assert "is also datasets.tupac16's output" in result.stderr


def test_missing_raw_data_fails_at_once_with_the_path_and_the_command(tmp_path):
    path = _pipeline(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["datasets"]["tupac16"]["requires"] = [
        {"path": str(tmp_path / "nowhere"), "make": "capsmed synth tupac16 DIR"}]
    path.write_text(yaml.safe_dump(raw))
    result = runner.invoke(app, ["run", str(path)])
    assert result.exit_code == 1
    assert f"{tmp_path / 'nowhere'}: not found" in result.stderr
    assert "make it with: capsmed synth tupac16 DIR" in result.stderr
    assert not (tmp_path / "out" / "runs").exists()


def _done_dirs(out: Path) -> dict[str, float]:
    return {p.parent.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*/summary.json")}


@pytest.mark.slow
def test_runs_are_skipped_resumed_and_rerun_by_identity(tmp_path):
    """SIGKILL the runner half-way: a restart retrains nothing that finished and ends
    with the same study tables as an uninterrupted run."""
    path, out = _pipeline(tmp_path), tmp_path / "out"
    select = ["--only", "arch=capsnet", "--set", "epochs=3"]
    proc = subprocess.Popen([sys.executable, "-m", "capsmed", "run", str(path), *select],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(_done_dirs(out)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = _done_dirs(out)
    assert 2 <= len(finished) < 4, "the runner was not killed half-way"
    time.sleep(1.0)  # the orphaned training (SIGTERM from its dead parent) saves and exits
    evaluated = len(list(out.glob("runs/*/report/report.json")))
    result = _capsmed_run(str(path), *select)
    assert result.returncode == 0, result.stdout + result.stderr
    after = _done_dirs(out)
    assert len(after) == 4 and all(after[k] == v for k, v in finished.items())
    assert (f"{evaluated} of 4 runs finished earlier" in result.stdout) == (evaluated > 0)
    reference = tmp_path / "reference"
    result = _capsmed_run(str(path), *select, "--set", f"out={reference}")
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "report" / "study.json").read_text()) == \
        json.loads((reference / "report" / "study.json").read_text())
    # same options: nothing to do; changed options: new identities, trained again
    result = _capsmed_run(str(path), *select)
    assert "4 of 4 runs finished earlier" in result.stdout and "start" not in result.stdout
    result = _capsmed_run("--dry-run", str(path), "--only", "arch=capsnet")
    assert "(4 not submitted)" in result.stdout  # epochs=1 (the default): new ids


@pytest.mark.slow
def test_a_failing_run_is_retried_reported_and_does_not_stop_the_others(tmp_path):
    path = _pipeline(tmp_path, rules=[{"when": {"condition": "half"},
                                       "set": {"imbalance": {"no-such-class": 20}}}])
    result = runner.invoke(app, ["run", str(path), "--only", "arch=lenet", "--retries", "1"])
    assert result.exit_code == 1
    assert "2 failed, 2 done" in result.output and "training failed; see" in result.output
    records = [json.loads(p.read_text())
               for p in (tmp_path / "out" / ".capsmed-run" / "runs").glob("*.json")]
    failed = [r for r in records if r["outcome"] == "failed"]
    assert len(failed) == 2 and all(r["attempts"] == 2 for r in failed)
    log = Path(failed[0]["log"]).read_text()
    assert "unknown class(es) no-such-class" in log
    status = runner.invoke(app, ["run", "status", str(path), "--only", "arch=lenet"])
    assert "(2 finished, 2 failed)" in status.output
    assert status.output.count("training failed; see") == 2  # each failure, with its log


def test_a_second_runner_on_the_same_folder_is_refused(tmp_path):
    path = _pipeline(tmp_path)
    lock = tmp_path / "out" / ".capsmed-run" / "runner.lock"
    lock.parent.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import socket

        lock.write_text(json.dumps({"host": socket.gethostname(), "pid": sleeper.pid}))
        result = runner.invoke(app, ["run", str(path)])
        assert result.exit_code == 1 and "another capsmed run" in result.stderr
    finally:
        sleeper.kill()
    shutil.rmtree(tmp_path / "out")


@pytest.mark.slow
def test_a_data_stage_whose_commands_changed_is_made_again(tmp_path):
    from capsmed.pipeline.execute import execute_stage, stage_done
    from capsmed.pipeline.state import PipelineState

    pipeline = load_pipeline(_pipeline(tmp_path))
    state, stage = PipelineState(pipeline.out), pipeline.stages["tupac16"]
    assert execute_stage(state, stage, {}) is None and stage_done(state, stage)
    first = stage.output.stat().st_mtime_ns
    changed = dataclasses.replace(stage, commands=tuple(
        (*c, "--jitter", "10") if c[0] == "preprocess" else c for c in stage.commands))
    assert not stage_done(state, changed)
    assert execute_stage(state, changed, {}) is None and stage_done(state, changed)
    assert stage.output.stat().st_mtime_ns != first
    assert not list(stage.output.parent.glob("*.previous"))
    broken = dataclasses.replace(changed, commands=(("preprocess", "tupac16", "/nowhere",
                                                     "-o", str(stage.output)),))
    assert "failed" in execute_stage(state, broken, {})
    assert stage.output.is_file()  # the last good file is put back


@pytest.mark.parametrize("extra, message", [
    (["--executor", "slurm"], "no sbatch on PATH"),
    (["--executor", "cloud"], "--executor must be one of local, slurm"),
])
def test_an_unusable_executor_is_refused_before_anything_runs(tmp_path, monkeypatch, extra,
                                                             message):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no sbatch here
    result = runner.invoke(app, ["run", str(_pipeline(tmp_path)), *extra])
    assert result.exit_code == 1 and message in result.stderr, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and not (tmp_path / "out").exists()


def test_estimates_skip_result_lines_that_are_not_training_figures(tmp_path):
    from capsmed.pipeline.estimate import user_rates

    (tmp_path / "other.jsonl").write_text(
        '{"device": "cpu", "arch": "lenet", "windows_per_s": 5}\n[1, 2]\n'
        '{"device": "cpu (x86_64)", "arch": "lenet", "batch_size": 32, "precision": '
        '"float32", "input": "1x28x28, 10 classes", "train_images_per_s": 900.0}\n')
    rates = user_rates(tmp_path)
    assert [(r.arch, r.batch, r.images_per_s, r.device, r.size) for r in rates] == [
        ("lenet", 32, 900.0, "cpu", 28)]


@pytest.mark.slow
def test_detach_runs_the_local_executor_in_the_background_and_wait_follows_it(tmp_path):
    path = _pipeline(tmp_path)
    select = ["--only", "arch=lenet,condition=full"]
    started = time.monotonic()
    detached = _capsmed_run(str(path), *select, "--detach")
    assert detached.returncode == 0, detached.stdout + detached.stderr
    assert "runner started in the background" in detached.stdout
    assert time.monotonic() - started < 60  # it returned before the runs finished
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    waited = subprocess.run([sys.executable, "-m", "capsmed", "run", "wait", str(path),
                             *select], cwd=elsewhere, capture_output=True, text=True,
                            timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "waiting for the runner" in waited.stdout
    assert len(_done_dirs(tmp_path / "out")) == 2
    assert (tmp_path / "out" / "report" / "study.md").is_file()
    assert not (tmp_path / "out" / ".capsmed-run" / "runner.lock").exists()


def test_paper_numbers_are_found_under_rows_yaml_reads_as_numbers():
    from capsmed.pipeline.study import _paper

    spec = {"paper": {0.5: {"lenet": 0.2}, "full": 0.9, 3: {5: 0.7}}}  # YAML's keys
    assert _paper(spec, "0.5", "lenet") == 0.2
    assert _paper(spec, "full", "capsnet") == 0.9
    assert _paper(spec, "3", "5") == 0.7 and _paper(spec, "half", "lenet") is None


def test_a_file_table_cell_pooling_two_configurations_is_noted():
    """A table of numbers from a file (only the runs that have it) is checked when it
    is drawn: a cell of two iteration counts is not a mean over seeds."""
    from capsmed.pipeline.spec import RunSpec
    from capsmed.pipeline.study import metric_table

    def run(iters, seed):
        return RunSpec({"arch": "capsnet", "dataset": "m", "iters": iters, "seed": seed},
                       f"r{iters}{seed}", {}, (), None)

    spec = {"rows": "arch", "columns": "dataset", "file": "a.json", "key": "x"}
    table, _ = metric_table(spec, [(run(3, 0), 0.2), (run(3, 1), 0.3)])
    assert not any("Not comparable" in n for n in table.notes)
    table, _ = metric_table(spec, [(run(3, 0), 0.2), (run(5, 0), 0.3)])
    assert "Not comparable: cell capsnet / m pools runs of iters 3, 5" in " ".join(table.notes)
