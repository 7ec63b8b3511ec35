"""MLflow tracking (``capsmed train --mlflow URI``): one MLflow run per capsmed run.

At the start the MLflow run is created in the experiment ``--mlflow-experiment``
(default: the dataset's name) under the run folder's name, with the run's options and
model arguments as params (:func:`~capsmed.train.handlers.run_params.run_params`), the
dataset's name, digest and domain and capsmed's version as tags, and ``config.yaml``
as the artifact ``run-config.yaml``; each epoch's record (losses, accuracies, learning rate, routing
entropy, images/s) is logged with the epoch as step; at the end ``summary.json``,
``curves.png`` and ``metrics.jsonl`` are logged and the MLflow run is finished.

``RUN_DIR/mlflow.json`` records where the run is tracked (tracking URI, experiment,
run id): ``capsmed train --resume`` continues the same MLflow run, and ``capsmed
evaluate`` logs its report there (:func:`log_report`). Rank 0 only under torchrun.

The ``mlflow`` package (``pip install 'capsmed[mlflow]'``, i.e. ``mlflow-skinny``) is
imported only when a run is tracked. A server that cannot be reached is refused before
the run folder is made; once training runs, a failure to log is a warning and
tracking stops for the rest of the run (``metrics.jsonl`` holds every epoch still),
rather than losing hours of training to a tracking server's hiccup.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capsmed import __version__
from capsmed.errors import CapsmedError, first_line, shell_quoted
from capsmed.io import write_text_atomic
from capsmed.train.handlers.base import LoopHandler, LoopState
from capsmed.train.handlers.run_params import run_params
from capsmed.train.run_config import CONFIG, METRICS, SUMMARY

if TYPE_CHECKING:
    from capsmed.train.config import TrainConfig
    from capsmed.train.run import Run

log = logging.getLogger(__name__)

MLFLOW_FILE = "mlflow.json"  # where RUN_DIR is tracked: tracking URI, experiment, run id
RUN_CONFIG_ARTIFACT = "run-config.yaml"  # the run's config.yaml, as an artifact
INSTALL = "pip install 'capsmed[mlflow]'"
# MLflow's own limits (mlflow.utils.validation); read from there when it has them
PARAMS_PER_BATCH = 100
PARAM_VALUE_LENGTH = 6000
# a check that the server answers: one try, 10 s, instead of MLflow's default retries
# with exponential back-off (minutes before an unreachable server is reported)
QUICK_REQUESTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def tracking_uri(value: str) -> str:
    """``value`` as MLflow's tracking URI: a URI as given (``http://...``, ``file:...``,
    ``databricks``), a local folder as the absolute ``file:`` URI of a file store."""
    if value == "databricks" or re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", value):
        return value
    return Path(value).expanduser().resolve().as_uri()


def mlflow_client(uri: str, option: str = "--mlflow") -> Any:
    """An ``MlflowClient`` for ``uri`` whose server answered, or a one-line error.

    A ``file:`` store is MLflow's file store, which MLflow 3 keeps in maintenance mode
    and refuses unless ``MLFLOW_ALLOW_FILE_STORE`` is set: a folder given here asks
    for exactly that store, so it is allowed (unless that variable says otherwise).
    """
    try:
        from mlflow import MlflowClient
    except ImportError:
        raise CapsmedError(f"{option} needs the mlflow-skinny package: {INSTALL}") from None
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        with _quick_requests():
            client = MlflowClient(tracking_uri=uri)
            client.search_experiments(max_results=1)  # contacts the server
    except Exception as exc:  # MLflow raises its own, requests' and OSError's kinds
        raise CapsmedError(f"{option} {uri}: cannot reach the MLflow tracking store "
                           f"({first_line(exc)})") from None
    return client


@contextlib.contextmanager
def _quick_requests() -> Iterator[None]:
    """MLflow's HTTP settings for a reachability check, unless the user set them."""
    added = [k for k in QUICK_REQUESTS if k not in os.environ]
    os.environ.update({k: QUICK_REQUESTS[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def read_tracking(run_dir: Path) -> dict[str, str] | None:
    """What ``RUN_DIR/mlflow.json`` records, or None for a run not tracked."""
    path = Path(run_dir) / MLFLOW_FILE
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
        return {k: str(values[k]) for k in ("tracking_uri", "experiment_id", "run_id")}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CapsmedError(f"{path}: not a readable MLflow record ({first_line(exc)})"
                           ) from None


class MLflowTracking(LoopHandler):
    """One MLflow run per capsmed run (``--mlflow``). Rank 0 only."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.client: Any = None  # None once tracking stopped after a failure
        self.run_id = ""
        self.status = ""  # the MLflow run's status this process left it in

    @classmethod
    def create(cls, run: Run) -> MLflowTracking | None:
        return cls(run) if run.cfg.mlflow and run.ctx.is_main else None

    @staticmethod
    def check(cfg: TrainConfig) -> None:
        """The package is there and the server answers; a folder store is only checked
        writable here (contacting it would create it, and a resumed run's relative
        folder is another one from another working directory: its mlflow.json says
        which)."""
        if not cfg.mlflow:
            return
        uri = tracking_uri(cfg.mlflow)
        if not uri.startswith("file:"):
            mlflow_client(uri)
            return
        try:
            import mlflow  # noqa: F401 -- the run imports it next anyway
        except ImportError:
            raise CapsmedError(f"--mlflow needs the mlflow-skinny package: {INSTALL}"
                               ) from None
        folder = Path(urllib.parse.urlparse(uri).path)
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise CapsmedError(f"--mlflow {cfg.mlflow}: cannot write an MLflow store there "
                               f"({existing} is not a writable folder)")

    def on_start(self, loop: LoopState) -> None:
        """Create the MLflow run (a resumed run: take its own up again). A failure here
        stops the run: nothing is trained yet, and ``--resume`` starts it again."""
        run = self.run
        saved = read_tracking(run.run_dir)
        uri = saved["tracking_uri"] if saved else tracking_uri(str(run.cfg.mlflow))
        try:
            self.client = mlflow_client(uri)
            if saved:
                self.run_id = saved["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
                log.info("MLflow: continuing run %s at %s", self.run_id, uri)
                return
            self._create_run(uri)
        except CapsmedError:
            raise
        except Exception as exc:
            raise CapsmedError(f"{run.run_dir}: cannot start its MLflow run at {uri} "
                               f"({first_line(exc)}); continue with: capsmed train "
                               f"--resume {shell_quoted(run.run_dir)}") from None

    def _create_run(self, uri: str) -> None:
        run = self.run
        name = run.cfg.mlflow_experiment or run.info.dataset
        experiment_id = _experiment_id(self.client, name)
        tags = {"capsmed.version": __version__, "capsmed.dataset": run.info.dataset,
                "capsmed.dataset_digest": run.data_digest,
                "capsmed.domain": run.info.image_domain().name,
                "capsmed.arch": run.cfg.arch, "capsmed.run_dir": str(run.run_dir.resolve())}
        created = self.client.create_run(experiment_id, run_name=run.run_dir.name, tags=tags)
        self.run_id = created.info.run_id
        self._log_params()
        # not under its own name: a folder holding config.yaml is a run directory to
        # capsmed runs ls and capsmed report, and a file store below the runs folder
        # would then list each run twice
        self.client.log_text(self.run_id, (run.run_dir / CONFIG).read_text(encoding="utf-8"),
                             RUN_CONFIG_ARTIFACT)
        # last: --resume continues the run mlflow.json names without logging its params
        # again, so a set-up that failed half-way (marked FAILED by close) is not named;
        # the resumed run gets a whole new MLflow run
        write_text_atomic(run.run_dir / MLFLOW_FILE, json.dumps(
            {"tracking_uri": uri, "experiment_id": experiment_id, "experiment_name": name,
             "run_id": self.run_id}, indent=2))
        log.info("MLflow: run %s in experiment '%s' at %s", self.run_id, name, uri)

    def _log_params(self) -> None:
        from mlflow.entities import Param

        limit = _limit("MAX_PARAM_VAL_LENGTH", PARAM_VALUE_LENGTH)
        params, cut = [], []
        for key, value in run_params(self.run).items():
            text = str(value)
            if len(text) > limit:  # the whole value is in the config.yaml artifact
                text, cut = text[:limit - 3] + "...", [*cut, key]
            params.append(Param(key, text))
        batch = _limit("MAX_PARAMS_TAGS_PER_BATCH", PARAMS_PER_BATCH)
        for i in range(0, len(params), batch):
            self.client.log_batch(self.run_id, params=params[i:i + batch])
        if cut:
            log.info("MLflow: params %s cut to %d characters (the config.yaml artifact "
                     "holds them whole)", ", ".join(cut), limit)

    def on_epoch_end(self, loop: LoopState) -> None:
        from mlflow.entities import Metric

        record, now = loop.record, int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, record["epoch"]) for k, v in record.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)
                   and k != "epoch"]
        self._safely(f"log the metrics of epoch {record['epoch']}",
                     lambda: self.client.log_batch(self.run_id, metrics=metrics))

    def on_stop(self, loop: LoopState) -> None:
        self._finish("KILLED")  # stopped on request; --resume takes it up again

    def on_end(self, loop: LoopState) -> None:
        run_dir = self.run.run_dir
        for name in (SUMMARY, "curves.png", METRICS):
            if (run_dir / name).is_file():
                self._safely(f"log {name}",
                             lambda n=name: self.client.log_artifact(self.run_id,
                                                                    str(run_dir / n)))
        self._finish("FINISHED")

    def close(self) -> None:
        if self.run_id and not self.status:  # the loop ended by an error
            self._finish("FAILED")

    def _finish(self, status: str) -> None:
        self.status = status
        self._safely(f"mark the run {status}",
                     lambda: self.client.set_terminated(self.run_id, status=status))

    def _safely(self, what: str, call: Any) -> None:
        """Make ``call``; on a failure, warn once and stop tracking the run."""
        if self.client is None:
            return
        try:
            call()
        except Exception as exc:
            log.warning("MLflow: could not %s for run %s (%s); tracking stops here, "
                        "training goes on (every epoch is in %s)", what, self.run_id,
                        first_line(exc), self.run.run_dir / METRICS)
            self.client = None


def _experiment_id(client: Any, name: str) -> str:
    """The experiment ``name``, created if it does not exist (by this process or, at
    the same moment, by another run of a study)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:
        found = client.get_experiment_by_name(name)  # another process created it
        if found is None:
            raise
        return found.experiment_id


def _limit(name: str, default: int) -> int:
    """One of MLflow's limits as the installed version has it (older ones were lower)."""
    try:
        from mlflow.utils import validation

        return int(getattr(validation, name, default))
    except ImportError:
        return default


def log_report(run_dir: Path, metrics: dict[str, float], report_dir: Path,
               step: int) -> None:
    """Log an evaluation of ``run_dir`` to its MLflow run, if it is tracked: the
    report's numbers as ``metrics`` at ``step`` (the checkpoint's epoch) and the
    report folder as artifacts under its own name. The report's files are written
    already, so a failure here is a warning."""
    saved = read_tracking(run_dir)
    if saved is None:
        return
    try:
        from mlflow.entities import Metric

        client = mlflow_client(saved["tracking_uri"], option=str(run_dir / MLFLOW_FILE))
        now = int(time.time() * 1000)
        client.log_batch(saved["run_id"], metrics=[
            Metric(k, float(v), now, step) for k, v in metrics.items()])
        client.log_artifacts(saved["run_id"], str(report_dir), report_dir.name)
    except ImportError:
        log.warning("%s: the run is tracked in MLflow (%s) but mlflow is not installed: "
                    "the report is not logged there (%s)", run_dir, MLFLOW_FILE, INSTALL)
        return
    except Exception as exc:
        log.warning("%s: the report was not logged to MLflow run %s (%s)", run_dir,
                    saved["run_id"], first_line(exc))
        return
    log.info("MLflow: report logged to run %s", saved["run_id"])
