"""``--json``: each command's result parses as JSON from stdout alone (logs on stderr),
and says what its files and tables say; shell completion is on and completes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsmed.cli import app
from tests.faults.common import TINY_LENET

runner = CliRunner()


def run_json(*args: object) -> object:
    """Run ``capsmed ARGS --json`` (without -q: logs must stay off stdout) and parse
    stdout, which must hold the JSON and nothing else."""
    result = runner.invoke(app, [*map(str, args), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def evaluated_run(tiny_h5, tmp_path_factory) -> Path:
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train

    out = tmp_path_factory.mktemp("json") / "runs" / "lenet"
    run = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                            out=str(out), model_kwargs=TINY_LENET), disable_progress=True)
    result = runner.invoke(app, ["-q", "evaluate", str(run), "--no-grids", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    return run


def test_evaluate_prints_report_json(evaluated_run):
    printed = run_json("evaluate", evaluated_run, "--no-grids", "--device", "cpu")
    written = json.loads((evaluated_run / "report" / "report.json").read_text())
    assert printed == written and printed["split"] == "test"
    assert set(printed["per_class"]) == set(printed["class_names"])


def test_runs_ls_lists_each_run(evaluated_run):
    root = evaluated_run.parent
    printed = run_json("runs", "ls", root)
    assert len(printed) == 1
    run = printed[0]
    assert run["run"] == "lenet" and run["arch"] == "lenet" and run["evaluated"] is True
    assert run["epochs_run"] == 1 and run["best_epoch"] == 1
    record = json.loads((evaluated_run / "metrics.jsonl").read_text().splitlines()[0])
    assert run["val_loss"] == pytest.approx(record["val_loss"])
    assert run["report_stale"] is False
    assert run_json("runs", "ls", evaluated_run / "report") == []


def test_data_info_describes_the_file(tiny_h5):
    from capsmed.data.contract import class_counts, groups_by_split, read_info

    printed = run_json("data", "info", tiny_h5)
    info = read_info(tiny_h5)
    assert printed["dataset"] == info.dataset and printed["class_names"] == list(
        info.class_names)
    assert printed["image_size"] == list(info.image_size)
    for split, row in class_counts(tiny_h5).items():
        assert list(printed["splits"][split]["class_counts"].values()) == row.tolist()
        assert printed["groups"][split] == sorted(groups_by_split(tiny_h5)[split])
    assert printed["leaks"] == {}
    assert printed["preprocessing"] == json.loads(json.dumps(info.preprocessing))


def test_models_lists_every_architecture():
    from capsmed.models import list_models

    printed = run_json("models", "--input-size", "28", "--num-classes", "2")
    assert [m["name"] for m in printed] == [e.name for e in list_models()]
    lenet = next(m for m in printed if m["name"] == "lenet")
    assert isinstance(lenet["parameters"], int) and lenet["parameters"] > 0
    assert "in_channels" not in lenet["options"] and lenet["note"] is None


def test_bench_train_prints_the_results_it_appends(tmp_path):
    results = tmp_path / "bench.jsonl"
    printed = run_json("bench", "train", "--arch", "lenet", "--steps", "1", "--warmup", "0",
                       "--batch-size", "4", "--device", "cpu", "--model-arg", "widths=[3,4]",
                       "--model-arg", "hidden=[8]", "--results", results)
    appended = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(printed) == 1 and printed[0]["arch"] == "lenet"
    assert {k: v for k, v in appended[0].items() if k != "host"} == printed[0]


def test_predict_prints_its_summary(evaluated_run, tiny_raw, tmp_path):
    image = sorted(tiny_raw.rglob("*.tif"))[0]
    shutil.copy(image, tmp_path / "new.tif")
    out = tmp_path / "pred"
    printed = run_json("predict", evaluated_run, tmp_path / "new.tif", "-o", out,
                       "--device", "cpu", "--no-heatmaps")
    assert printed == json.loads((out / "summary.json").read_text())
    assert printed["inputs"] == 1 and printed["windows"] > 0


def test_report_prints_its_summary(evaluated_run, tmp_path):
    out = tmp_path / "report"
    printed = run_json("report", evaluated_run, "-o", out)
    assert printed == json.loads((out / "summary.json").read_text())


def test_run_status_lists_each_run_and_the_counts(tmp_path):
    """A bundled study by name, one of its runs failed on Slurm (in the ledger only)."""
    from capsmed.pipeline.ledger import Ledger
    from capsmed.pipeline.spec import load_pipeline
    from capsmed.pipeline.state import PipelineState
    from capsmed.pipeline.tasks import RunTask
    from capsmed.pipeline.work import FAILED, Job, JobState, WorkItem

    out = tmp_path / "out"
    pipeline = load_pipeline(Path(__file__).parents[1] / "pipelines" / "smoke.yaml",
                             {"out": str(out)})
    failed = pipeline.runs[2]
    item = WorkItem(f"run:{failed.label}", failed.label, RunTask(pipeline.out, failed), None)
    ledger, job = Ledger(PipelineState(pipeline.out).records), Job(item.key, "slurm", "7_2")
    ledger.submitted(item, job)
    ledger.ended(job, JobState(FAILED, "Slurm: time limit reached"))

    printed = run_json("run", "status", "smoke", "--set", f"out={out}")
    assert printed["study"] == "smoke" and printed["out"] == str(out)
    assert printed["counts"] == {"failed": 1, "not submitted": 7}
    assert [r["label"] for r in printed["runs"]] == [r.label for r in pipeline.runs]
    row = printed["runs"][2]
    assert row["fields"] == failed.fields and row["status"] == "failed"
    assert row["reason"] == "Slurm: time limit reached"
    assert {r["reason"] for r in printed["runs"] if r is not row} == {""}
    refused = runner.invoke(app, ["run", "--dry-run", "smoke", "--json"])
    assert refused.exit_code == 1 and "--json goes with" in refused.stderr


def test_shell_completion_is_on_and_completes():
    """What the installed completion script asks: the words after ``capsmed tr``."""
    help_text = runner.invoke(app, ["--help"]).stdout
    assert "--install-completion" in help_text and "--show-completion" in help_text
    env = {**os.environ, "_CAPSMED_COMPLETE": "complete_bash",
           "COMP_WORDS": "capsmed train --mlf", "COMP_CWORD": "2"}
    code = "import sys; sys.argv[0] = 'capsmed'; from capsmed.cli import main; main()"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["--mlflow", "--mlflow-experiment"]
