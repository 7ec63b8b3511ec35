"""MLflow tracking (``--mlflow``): one MLflow run per capsmed run, read back with MLflow's
own client from a local file store; training unchanged by it; resume continues the same
MLflow run; ``capsmed evaluate`` logs its report there; refusals at start."""

from __future__ import annotations

import json
import logging
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from capsmed import __version__
from capsmed.errors import CapsmedError
from capsmed.runs.index import find_runs
from capsmed.train.config import TrainConfig
from capsmed.train.engine import resume, train
from capsmed.train.handlers import HANDLERS
from capsmed.train.handlers.mlflow_tracking import (
    MLFLOW_FILE,
    RUN_CONFIG_ARTIFACT,
    MLflowTracking,
    tracking_uri,
)
from capsmed.train.loop import TrainingInterrupted
from tests.faults.common import TINY_LENET, invoke, lenet_args
from tests.faults.conftest import write_toy
from tests.helpers import assert_clean_failure

mlflow = pytest.importorskip("mlflow")


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # no network from tests


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    return write_toy(tmp_path_factory.mktemp("toy") / "toy.h5")


def _cfg(data: Path, out: Path, **options) -> TrainConfig:
    return TrainConfig(**{"data": str(data), "arch": "lenet", "epochs": 2, "batch_size": 16,
                          "seed": 5, "out": str(out), "model_kwargs": TINY_LENET,
                          **options})


def _client(run_dir: Path):
    record = json.loads((run_dir / MLFLOW_FILE).read_text())
    return mlflow.MlflowClient(record["tracking_uri"]), record


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_tracked_run_is_read_back_and_trains_exactly_as_untracked(toy, tmp_path):
    plain = train(_cfg(toy, tmp_path / "plain"), disable_progress=True)
    store = tmp_path / "mlruns"
    tracked = train(_cfg(toy, tmp_path / "tracked", mlflow=str(store)),
                    disable_progress=True)
    a, b = load_file(str(plain / "checkpoint.safetensors")), \
        load_file(str(tracked / "checkpoint.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    strip = ("seconds", "images_per_s")
    assert [{k: v for k, v in r.items() if k not in strip} for r in _metrics(plain)] == \
        [{k: v for k, v in r.items() if k not in strip} for r in _metrics(tracked)]

    client, record = _client(tracked)
    assert record["tracking_uri"] == store.resolve().as_uri()
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    assert client.get_experiment(run.info.experiment_id).name == "toy"  # the dataset's
    params, tags = run.data.params, run.data.tags
    assert params["arch"] == "lenet" and params["batch_size"] == "16"
    assert params["model.widths"] == "[3, 4]" and params["model.num_classes"] == "2"
    assert params["lr"] == "0.0001" and params["fold"] == "null"
    config = (tracked / "config.yaml").read_text()
    assert tags["capsmed.dataset"] == "toy" and tags["capsmed.domain"] == "generic"
    assert f"digest: {tags['capsmed.dataset_digest']}" in config
    assert tags["capsmed.version"] == __version__
    history = client.get_metric_history(record["run_id"], "val_loss")
    assert [(m.step, m.value) for m in history] == \
        [(r["epoch"], r["val_loss"]) for r in _metrics(tracked)]
    assert {"train_loss", "train_acc", "val_acc", "lr", "images_per_s"} <= run.data.metrics.keys()
    artifacts = {f.path for f in client.list_artifacts(record["run_id"])}
    assert {"run-config.yaml", "summary.json", "curves.png", "metrics.jsonl"} <= artifacts
    assert "config.yaml" not in artifacts  # else the store's copy is a run to runs ls
    local = Path(client.download_artifacts(record["run_id"], "summary.json", str(tmp_path)))
    assert local.read_text() == (tracked / "summary.json").read_text()
    local = Path(client.download_artifacts(record["run_id"], "run-config.yaml", str(tmp_path)))
    assert local.read_text() == config

    from capsmed.evaluate.evaluation import evaluate_run

    evaluation = evaluate_run(tracked, grids=False, disable_progress=True)
    report = json.loads((evaluation.report_dir / "report.json").read_text())
    metrics = client.get_run(record["run_id"]).data.metrics
    assert metrics["test/accuracy"] == pytest.approx(report["accuracy"])
    assert metrics["test/macro_f1"] == pytest.approx(report["macro_f1"])
    assert metrics["test/auc"] == pytest.approx(report["auc"])
    for name in ("dark", "bright"):
        for key in ("precision", "sensitivity"):
            value = report["per_class"][name][key]
            assert metrics[f"test/{key}.{name}"] == pytest.approx(value)
    step = client.get_metric_history(record["run_id"], "test/accuracy")[0].step
    assert step == json.loads((tracked / "summary.json").read_text())["best_epoch"]
    reported = {f.path for f in client.list_artifacts(record["run_id"], "report")}
    assert {"report/report.html", "report/report.json"} <= reported
    # the store is below the same folder as the runs: they are listed once each
    assert [r.path for r in find_runs(tmp_path)] == [plain, tracked]
    # and tracking is no setting of the experiment: capsmed report groups both as one
    from capsmed.evaluate.aggregate import load_evaluated_run

    evaluate_run(plain, grids=False, disable_progress=True)
    assert load_evaluated_run(plain).other == load_evaluated_run(tracked).other


def test_a_run_that_fails_is_marked_failed(toy, tmp_path, monkeypatch):
    from capsmed.train.handlers.metrics_file import MetricsFile

    def full_disk(self, loop):
        raise CapsmedError("no space left")

    monkeypatch.setattr(MetricsFile, "on_epoch_end", full_disk)
    with pytest.raises(CapsmedError, match="no space left"):
        train(_cfg(toy, tmp_path / "run", mlflow=str(tmp_path / "store")),
              disable_progress=True)
    client, record = _client(tmp_path / "run")
    assert client.get_run(record["run_id"]).info.status == "FAILED"


def test_resume_continues_the_same_mlflow_run(toy, tmp_path, monkeypatch):
    """Even from another working directory, with the store given as a relative folder."""
    for folder in ("first", "second"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / "first")
    cfg = _cfg(toy, tmp_path / "run", mlflow="store", epochs=3,
               mlflow_experiment="resumed", state_every_minutes=0)
    with pytest.raises(TrainingInterrupted):
        train(cfg, disable_progress=True, stop_after_steps=4)  # inside epoch 2 (3 steps)
    client, record = _client(tmp_path / "run")
    assert record["tracking_uri"] == (tmp_path / "first" / "store").as_uri()
    assert client.get_run(record["run_id"]).info.status == "KILLED"
    monkeypatch.chdir(tmp_path / "second")
    resume(tmp_path / "run", disable_progress=True)
    assert not (tmp_path / "second" / "store").exists()
    assert _client(tmp_path / "run")[1] == record
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED"
    experiment = client.get_experiment_by_name("resumed")
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == \
        [record["run_id"]]
    steps = [m.step for m in client.get_metric_history(record["run_id"], "train_loss")]
    assert steps == [1, 2, 3]


def test_a_failure_to_log_warns_and_training_goes_on(toy, tmp_path, monkeypatch, caplog):
    from mlflow.tracking import MlflowClient

    real = MlflowClient.log_batch

    def failing(self, run_id, metrics=(), **kwargs):
        if metrics:
            raise RuntimeError("server went away")
        return real(self, run_id, metrics=metrics, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", failing)
    with caplog.at_level(logging.WARNING, logger="capsmed"):
        run_dir = train(_cfg(toy, tmp_path / "run", mlflow=str(tmp_path / "store")),
                        disable_progress=True)
    assert len(_metrics(run_dir)) == 2 and (run_dir / "summary.json").is_file()
    warnings = [r.getMessage() for r in caplog.records if "MLflow" in r.getMessage()]
    assert len(warnings) == 1 and "server went away" in warnings[0], warnings
    client, record = _client(run_dir)
    assert client.get_run(record["run_id"]).data.metrics == {}


def test_long_param_values_are_cut_to_mlflows_limit(toy, tmp_path, monkeypatch):
    from mlflow.utils import validation

    monkeypatch.setattr(validation, "MAX_PARAM_VAL_LENGTH", 24)
    run_dir = train(_cfg(toy, tmp_path / "a-rather-long-run-folder-name",
                         mlflow=str(tmp_path / "store"), epochs=1), disable_progress=True)
    client, record = _client(run_dir)
    out = client.get_run(record["run_id"]).data.params["out"]
    assert len(out) == 24 and out.endswith("...") and str(run_dir).startswith(out[:-3])


def test_an_unreachable_server_is_refused_before_the_run_folder(toy, tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run"
    result = invoke(lenet_args(toy, out, "--mlflow", f"http://127.0.0.1:{port}"))
    assert_clean_failure(result, f"--mlflow http://127.0.0.1:{port}: cannot reach", out)


def test_a_store_folder_that_cannot_be_written_is_refused_before_the_run(toy, tmp_path):
    (tmp_path / "a-file").write_text("x")
    out = tmp_path / "run"
    result = invoke(lenet_args(toy, out, "--mlflow", str(tmp_path / "a-file" / "store")))
    assert_clean_failure(result, "cannot write an MLflow store there", out)


def test_without_mlflow_installed_the_option_is_refused(toy, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import fails
    out = tmp_path / "run"
    result = invoke(lenet_args(toy, out, "--mlflow", str(tmp_path / "store")))
    assert_clean_failure(result, "pip install 'capsmed[mlflow]'", out)
    assert not (tmp_path / "store").exists()


def test_only_rank_0_tracks_and_after_the_summary():
    names = [h.__name__ for h in HANDLERS]
    assert names.index("RunSummary") < names.index("MLflowTracking") \
        < names.index("ResumableState")
    run = SimpleNamespace(cfg=SimpleNamespace(mlflow="x"), ctx=SimpleNamespace(is_main=False))
    assert MLflowTracking.create(run) is None
    run.ctx.is_main = True
    assert isinstance(MLflowTracking.create(run), MLflowTracking)
    run.cfg.mlflow = None
    assert MLflowTracking.create(run) is None


@pytest.mark.parametrize(("given", "expected"), [
    ("http://host:5000", "http://host:5000"), ("databricks", "databricks"),
    ("file:/srv/mlruns", "file:/srv/mlruns"), ("sqlite:///m.db", "sqlite:///m.db")])
def test_tracking_uris_pass_as_given_and_folders_become_file_uris(given, expected, tmp_path,
                                                                monkeypatch):
    assert tracking_uri(given) == expected
    monkeypatch.chdir(tmp_path)
    assert tracking_uri("mlruns") == (tmp_path / "mlruns").resolve().as_uri()


def test_evaluating_an_untracked_run_needs_no_mlflow(toy, tmp_path, monkeypatch):
    run_dir = train(_cfg(toy, tmp_path / "run", epochs=1), disable_progress=True)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    from capsmed.evaluate.evaluation import evaluate_run

    assert evaluate_run(run_dir, grids=False).report.accuracy is not None
    with pytest.raises(CapsmedError, match="capsmed\\[mlflow\\]"):
        MLflowTracking.check(_cfg(toy, tmp_path / "x", mlflow="store"))


def test_a_run_whose_mlflow_set_up_failed_is_resumed_with_its_params(toy, tmp_path,
                                                                     monkeypatch):
    """The error says: continue with --resume. That must not continue an MLflow run
    whose params and config were never logged (it would finish without them)."""
    from mlflow.tracking import MlflowClient

    real = MlflowClient.log_batch

    def failing(self, run_id, metrics=(), params=(), **kwargs):
        if params:
            raise RuntimeError("server hiccup")
        return real(self, run_id, metrics=metrics, params=params, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", failing)
    store = tmp_path / "store"
    with pytest.raises(CapsmedError, match="--resume"):
        train(_cfg(toy, tmp_path / "run", mlflow=str(store), epochs=1), disable_progress=True)
    monkeypatch.setattr(MlflowClient, "log_batch", real)
    resume(tmp_path / "run", disable_progress=True)
    client, record = _client(tmp_path / "run")
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["arch"] == "lenet" and run.data.params["epochs"] == "1"
    assert RUN_CONFIG_ARTIFACT in {f.path for f in client.list_artifacts(record["run_id"])}
    others = [r for r in client.search_runs([record["experiment_id"]])
              if r.info.run_id != record["run_id"]]
    assert [r.info.status for r in others] == ["FAILED"]  # the half-made one, marked


def test_evaluating_another_file_logs_under_its_name_not_as_the_runs_test(toy, tmp_path):
    """``evaluate --data other.h5`` must not replace the run's own ``test/accuracy``."""
    from capsmed.evaluate.evaluation import evaluate_run

    run_dir = train(_cfg(toy, tmp_path / "run", mlflow=str(tmp_path / "store"), epochs=1),
                    disable_progress=True)
    own = evaluate_run(run_dir, grids=False, disable_progress=True).report.accuracy
    other = write_toy(tmp_path / "other.h5", seed=3, sizes={"train": 4, "test": 12})
    elsewhere = evaluate_run(run_dir, data=other, grids=False, disable_progress=True)
    client, record = _client(run_dir)
    metrics = client.get_run(record["run_id"]).data.metrics
    assert [m.value for m in client.get_metric_history(record["run_id"], "test/accuracy")
            ] == [pytest.approx(own)]
    assert metrics["other/test/accuracy"] == pytest.approx(elsewhere.report.accuracy)
