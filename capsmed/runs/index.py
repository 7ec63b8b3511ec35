"""Find and summarise run directories (``capsmed runs ls``, ``capsmed report``)."""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import yaml

from capsmed.errors import shell_quoted
from capsmed.train.protocol import protocol_label, protocol_settings, transfer_source
from capsmed.train.run_config import CONFIG, META, METRICS, metric_records, training_unfinished
from capsmed.yamlfile import load_yaml

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSummary:
    """What a run directory says about itself."""

    path: Path
    arch: str
    dataset: str
    protocol: str
    epochs_run: int
    best_epoch: int | None
    val_loss: float | None
    val_acc: float | None
    evaluated: bool
    report_epoch: int | None = None  # the checkpoint epoch report/report.json scored
    epochs_planned: int | None = None  # set while the run is unfinished
    # digests of the weights report/report.json scored and of those the run keeps now
    # (None: a report or checkpoint from before capsmed recorded them)
    report_weights: str | None = None
    weights_digest: str | None = None

    @property
    def report_stale(self) -> bool:
        """The report scored other weights than the run keeps: it trained on after its
        evaluation, or its checkpoint was replaced (the same epoch of a retrained or
        resumed run, a copied-in pair). By digest where both are recorded, else by epoch."""
        return self.stale_reason is not None

    @property
    def stale_reason(self) -> str | None:
        """Why the report is stale (``capsmed report``'s refusal), None when current."""
        report = self.path / "report" / "report.json"
        fix = f"; run: capsmed evaluate {shell_quoted(self.path)}"
        if self.report_epoch is not None and self.report_epoch != self.best_epoch:
            return (f"{report}: scored the epoch {self.report_epoch} checkpoint, but the "
                    f"run now keeps epoch {self.best_epoch} (it trained on after the "
                    f"evaluation){fix}")
        if self.report_weights and self.weights_digest \
                and self.report_weights != self.weights_digest:
            return (f"{report}: scored other weights than the run's checkpoint now holds "
                    f"(their digests differ: it was retrained or replaced after the "
                    f"evaluation){fix}")
        return None


def _protocol(train: dict, dataset: dict | None = None) -> str:
    """The run's protocol (:mod:`capsmed.train.protocol`) and, for CV, its fold
    (``dataset``: config.yaml's section, which holds the file's number of folds)."""
    label = protocol_label(protocol_settings(train, transfer_source(train),
                                             (dataset or {}).get("folds")))
    return label + (f", fold {train['fold']}" if train.get("fold") is not None else "")


def _object(path: Path, text: str, kind: str) -> dict:
    value = load_yaml(text, path) if kind == "yaml" else json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"{path.name} is not a mapping")
    return value


def summarise_run(run_dir: Path) -> RunSummary:
    """Read a run's config, metrics and checkpoint metadata (raises on a broken run)."""
    config_path = run_dir / CONFIG
    config = _object(config_path, config_path.read_text(encoding="utf-8"), "yaml")
    train, dataset = config.get("train"), config.get("dataset")
    if not isinstance(train, dict) or not isinstance(dataset, dict):
        raise ValueError("config.yaml has no train and dataset sections")
    unfinished = training_unfinished(run_dir) is not None
    metrics_path = run_dir / METRICS
    if unfinished and not metrics_path.exists():  # stopped in its first epoch
        metrics = []
    else:
        metrics = metric_records(metrics_path.read_text(encoding="utf-8").splitlines())
    meta_path = run_dir / META
    meta = (_object(meta_path, meta_path.read_text(encoding="utf-8"), "json")
            if meta_path.is_file() else {})
    best = meta.get("epoch")
    report_path = run_dir / "report" / "report.json"
    report: dict = {}
    if report_path.is_file():
        with contextlib.suppress(ValueError):  # capsmed report says what is wrong
            report = _object(report_path, report_path.read_text(encoding="utf-8"), "json")
    at_best = next((m for m in metrics if m["epoch"] == best), {})
    return RunSummary(path=run_dir, arch=str(train.get("arch")),
                      dataset=str(dataset.get("name")), protocol=_protocol(train, dataset),
                      epochs_run=len(metrics), best_epoch=best,
                      val_loss=at_best.get("val_loss"), val_acc=at_best.get("val_acc"),
                      evaluated=report_path.is_file(),
                      report_epoch=report.get("checkpoint_epoch"),
                      epochs_planned=train.get("epochs") if unfinished else None,
                      report_weights=_text(report.get("weights_digest")),
                      weights_digest=_text(meta.get("weights_digest")))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def find_runs(root: Path) -> list[RunSummary]:
    """Every run directory below ``root`` (a folder with ``config.yaml``), sorted by path.

    Folders that look like runs but cannot be read are skipped with a warning; hidden
    folders below ``root`` (a run or report being written, ``.NAME.*.partial``) are not
    runs.
    """
    runs = []
    for config in sorted(Path(root).rglob(CONFIG)):
        if is_hidden_below(config.parent, Path(root)):
            continue
        try:
            runs.append(summarise_run(config.parent))
        except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
            log.warning("%s: skipped, not a readable run (%s)", config.parent, exc)
    return runs


def is_hidden_below(folder: Path, root: Path) -> bool:
    """Whether ``folder`` is, or lies in, a hidden folder below ``root``."""
    try:
        parts = folder.relative_to(root).parts
    except ValueError:
        return False
    return any(part.startswith(".") for part in parts)
