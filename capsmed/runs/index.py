"""Find and summarise run directories (``capsmed runs ls``, ``capsmed report``)."""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import yaml

from capsmed.train.protocol import protocol_label, protocol_settings, transfer_source
from capsmed.train.run_config import CONFIG, META, METRICS, RESUME_FILE, metric_records
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
    epochs_planned: int | None = None  # set while the run is unfinished (resume.pt)

    @property
    def report_stale(self) -> bool:
        """The run trained on after its evaluation: its report scored an older model."""
        return self.report_epoch is not None and self.report_epoch != self.best_epoch


def _protocol(train: dict) -> str:
    """The run's protocol (:mod:`capsmed.train.protocol`) and, for CV, its fold."""
    label = protocol_label(protocol_settings(train, transfer_source(train)))
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
    unfinished = (run_dir / RESUME_FILE).is_file()
    metrics_path = run_dir / METRICS
    if unfinished and not metrics_path.exists():  # stopped in its first epoch
        metrics = []
    else:
        metrics = metric_records(metrics_path.read_text(encoding="utf-8").splitlines())
    meta_path = run_dir / META
    best = (_object(meta_path, meta_path.read_text(encoding="utf-8"), "json").get("epoch")
            if meta_path.is_file() else None)
    report_path = run_dir / "report" / "report.json"
    report_epoch = None
    if report_path.is_file():
        with contextlib.suppress(ValueError):  # capsmed report says what is wrong
            report_epoch = _object(report_path, report_path.read_text(encoding="utf-8"),
                                   "json").get("checkpoint_epoch")
    at_best = next((m for m in metrics if m["epoch"] == best), {})
    return RunSummary(path=run_dir, arch=str(train.get("arch")),
                      dataset=str(dataset.get("name")), protocol=_protocol(train),
                      epochs_run=len(metrics), best_epoch=best,
                      val_loss=at_best.get("val_loss"), val_acc=at_best.get("val_acc"),
                      evaluated=report_path.is_file(), report_epoch=report_epoch,
                      epochs_planned=train.get("epochs") if unfinished else None)


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
