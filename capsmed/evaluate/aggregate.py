"""Aggregate evaluated runs: collect them, group them, mean +- std over repetitions.

A run counts once ``capsmed evaluate`` has written ``RUN_DIR/report/report.json``.
Runs are grouped by (dataset, architecture, protocol), where the protocol is the
data-challenge setting read from ``config.yaml`` (fraction, imbalance, augmentation,
sampler, class weights, cross-validation folds, per-class limit); the runs of a group
are its repetitions, told apart by seed and fold. Paper 000 reports the mean and
standard deviation over 4 repetitions (:func:`describe`); paper 001 pools its 5 CV
folds, which :mod:`capsmed.evaluate.per_class` does.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from capsmed.errors import CapsmedError, shell_quoted
from capsmed.runs.index import find_runs, is_hidden_below, summarise_run
from capsmed.train.protocol import (
    PROTOCOL_DEFAULTS,
    REPETITION_KEYS,
    protocol_label,
    protocol_settings,
    protocol_sort_key,
    transfer_source,
)
from capsmed.train.run_config import training_unfinished
from capsmed.yamlfile import load_yaml

log = logging.getLogger(__name__)

# Keys of report.json that describe the evaluation rather than measure it.
# (data_revision is a number, but of the file's preprocessing, not a score: averaged
# it would be a "metric" of the tables, --metric and the paired tests)
CONTEXT_KEYS = frozenset({"run_dir", "arch", "dataset", "data", "split", "checkpoint_epoch",
                          "samples", "class_names", "per_class", "total",
                          "confusion_matrix", "notes", "predictions_digest",
                          "weights_digest", "data_digest", "data_revision"})
COUNT_KEYS = frozenset({"support", "samples"})
REVISION = "protocol_revision"  # config.yaml environment key: see PROTOCOL_REVISION
REQUIRED_KEYS = ("class_names", "per_class", "total", "accuracy", "balanced_accuracy",
                 "confusion_matrix")
# Shown first, in this order; any other metric a report carries (AUC, ...) follows.
METRIC_ORDER = ("macro_f1", "accuracy", "balanced_accuracy", "macro_precision",
                "macro_sensitivity", "macro_specificity", "weighted_f1", "auc", "macro_auc",
                "agreement")


@dataclass(frozen=True)
class Stat:
    """Mean, sample standard deviation (ddof=1; None below 2 values) and count."""

    mean: float
    std: float | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std, "n": self.n}


def describe(values: Iterable[float]) -> Stat:
    """Mean +- sample std of ``values`` (paper 000's figures are over 4 repetitions)."""
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        raise ValueError("describe() needs at least one value")
    return Stat(mean=float(x.mean()), std=float(x.std(ddof=1)) if x.size > 1 else None,
                n=int(x.size))


@dataclass(frozen=True)
class EvaluatedRun:
    """One evaluated run: where it came from, what it is, what it scored."""

    path: Path
    dataset: str
    arch: str
    protocol: str
    settings: dict[str, Any]
    seed: int
    fold: int | None
    class_names: tuple[str, ...]
    metrics: dict[str, float]
    per_class: dict[str, dict[str, float]]
    confusion: np.ndarray
    other: dict[str, Any] = field(default_factory=dict)
    data_file: str = ""  # the training file: its content digest (or path, for old runs)
    data_name: str = ""  # and its file name
    predictions: str | None = None  # digest of the predicted labels (None: older report)
    unfinished: str | None = None  # e.g. "epoch 1 of 10": training had not finished

    @property
    def repetition(self) -> tuple[int, int | None]:
        """What pairs this run with another architecture's run: (seed, fold)."""
        return (self.seed, self.fold)

    @property
    def repetition_label(self) -> str:
        return f"seed {self.seed}" + (f" fold {self.fold}" if self.fold is not None else "")

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "dataset": self.dataset, "arch": self.arch,
                "protocol": self.protocol, "settings": self.settings, "seed": self.seed,
                "fold": self.fold, "metrics": self.metrics, "per_class": self.per_class,
                "confusion_matrix": self.confusion.tolist(),
                "predictions_digest": self.predictions, "unfinished": self.unfinished}


@dataclass(frozen=True)
class SkippedRun:
    """A run directory that was found but could not be aggregated, and why."""

    path: Path
    reason: str


@dataclass(frozen=True)
class Collection:
    """The evaluated runs under the given paths, and the ones left out."""

    runs: list[EvaluatedRun]
    skipped: list[SkippedRun]


def _read_structured(path: Path, loader: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
        value = json.loads(text) if loader == "json" else load_yaml(text, path)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        raise CapsmedError(f"{path}: cannot read {loader.upper()} "
                           f"({str(exc).splitlines()[0]})") from exc
    if not isinstance(value, dict):
        raise CapsmedError(f"{path}: expected a mapping")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def overall_metrics(report: dict[str, Any]) -> dict[str, float]:
    """Every run-level number of a report: Acc, balanced Acc, macro averages, extras.

    The Total row's entries become ``macro_<name>`` (unweighted class means, as the
    report's own ``macro_f1``); other numbers the report carries (``weighted_f1``,
    ``auc``, ...) keep their names, and a nested mapping of numbers becomes
    ``<key>_<name>``, or ``<key>`` for its own entry (``{"agreement": {"agreement": x}}``
    is ``agreement``, paper 001's Agr). Undefined values (null) are left out.
    """
    out = {f"macro_{k}": float(v) for k, v in report["total"].items()
           if k not in COUNT_KEYS and _is_number(v)}
    for key, value in report.items():
        if key in CONTEXT_KEYS:
            continue
        if _is_number(value):
            out[key] = float(value)
        elif isinstance(value, dict):
            out.update({key if k == key else f"{key}_{k}": float(v)
                        for k, v in value.items() if k not in COUNT_KEYS and _is_number(v)})
    return out


def load_evaluated_run(run_dir: Path, report_name: str = "report") -> EvaluatedRun:
    """Read ``config.yaml`` and ``<report_name>/report.json`` of an evaluated run."""
    run_dir = Path(run_dir)
    config = _read_structured(run_dir / "config.yaml", "yaml")
    report_path = run_dir / report_name / "report.json"
    report = _read_structured(report_path, "json")
    missing = [k for k in REQUIRED_KEYS if k not in report]
    if missing:
        raise CapsmedError(f"{report_path}: not a capsmed evaluate report (missing "
                           f"{', '.join(missing)}); re-run capsmed evaluate "
                           f"{shell_quoted(run_dir)}")
    train = config.get("train") or {}
    class_names = tuple(report["class_names"])
    confusion = np.asarray(report["confusion_matrix"], dtype=np.int64)
    if confusion.shape != (len(class_names),) * 2 or set(report["per_class"]) != set(
            class_names):
        raise CapsmedError(f"{report_path}: confusion matrix or per-class entries do not "
                           f"match its {len(class_names)} classes")
    trained_on = (config.get("dataset") or {}).get("name")
    dataset = str(report.get("dataset") or trained_on)
    if trained_on and trained_on != dataset:  # evaluate --data OTHER.h5
        dataset = f"{trained_on}->{dataset}"
    elif trained_on and not _evaluated_on_own_file(config, report):  # same name, other file
        dataset = f"{trained_on}->{Path(str(report['data'])).stem}"
    if report.get("split", "test") != "test":  # never average them with test scores
        dataset = f"{dataset} ({report['split']})"
    settings = protocol_settings(train, transfer_source(train),
                                 (config.get("dataset") or {}).get("folds"))
    other = {k: v for k, v in train.items()
             if k not in REPETITION_KEYS and k not in PROTOCOL_DEFAULTS}
    # the standardisation statistics follow the training subset; they are not a choice
    other["model_kwargs"] = {k: v for k, v in (config.get("model_kwargs") or {}).items()
                             if k not in ("input_mean", "input_std")}
    # 0: made before capsmed recorded it
    other[REVISION] = int((config.get("environment") or {}).get(REVISION, 0))
    fold = train.get("fold")
    return EvaluatedRun(
        path=run_dir, dataset=dataset, arch=str(report.get("arch") or train.get("arch")),
        protocol=protocol_label(settings), settings=settings, seed=int(train.get("seed", 0)),
        fold=None if fold is None else int(fold), class_names=class_names,
        metrics=overall_metrics(report),
        per_class={name: {k: float(v) for k, v in values.items()
                          if k not in COUNT_KEYS and _is_number(v)}
                   for name, values in report["per_class"].items()},
        confusion=confusion, other=other,
        data_file=str((config.get("dataset") or {}).get("digest") or train.get("data") or ""),
        data_name=Path(str(train.get("data") or "")).name,
        predictions=report.get("predictions_digest"), unfinished=_unfinished(run_dir))


def _unfinished(run_dir: Path) -> str | None:
    """``trained k of N epochs`` while the run's training has not finished
    (:func:`~capsmed.train.run_config.training_unfinished`), with the reason when
    ``capsmed train --resume`` cannot finish it."""
    late = training_unfinished(run_dir)
    if late is None:
        return None
    why = "" if late.resumable else f"; {late.reason}"
    try:
        summary = summarise_run(run_dir)
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return "training not finished" + why
    return f"trained {summary.epochs_run} of {summary.epochs_planned} epochs{why}"


def _evaluated_on_own_file(config: dict[str, Any], report: dict[str, Any]) -> bool:
    """Whether the report scored the file the run trained on: by content digest, or by
    path for reports written before evaluate recorded the digest."""
    trained = (config.get("dataset") or {}).get("digest")
    if trained and report.get("data_digest"):
        return bool(report["data_digest"] == trained)
    train_path = (config.get("train") or {}).get("data")
    if not train_path or not report.get("data"):
        return True
    return Path(str(report["data"])).name == Path(str(train_path)).name


def collect_runs(paths: Sequence[Path]) -> Collection:
    """Evaluated runs in ``paths`` (run directories or folders searched recursively).

    Runs without ``report/report.json`` and folders that are not readable runs are
    skipped with a warning; a report that exists but cannot be read is an error.
    """
    summaries, broken, seen = [], [], set()
    for root in map(Path, paths):
        if not root.exists():
            raise CapsmedError(f"{root}: no such run directory or folder")
        if not root.is_dir():
            raise CapsmedError(f"{root}: not a folder (give run directories or folders "
                               "holding them)")
        found = find_runs(root)  # warns about each unreadable run itself
        readable = {r.path for r in found}
        broken += [c.parent for c in sorted(root.rglob("config.yaml"))
                   if c.parent not in readable and not is_hidden_below(c.parent, root)]
        for summary in found:
            key = summary.path.resolve()
            if key not in seen:
                seen.add(key)
                summaries.append(summary)
    runs: list[EvaluatedRun] = []
    skipped = [SkippedRun(p, "not a readable run directory") for p in broken]
    for summary in summaries:
        if summary.stale_reason is not None:
            raise CapsmedError(summary.stale_reason)
        if not summary.evaluated:
            reason = f"not evaluated yet; run: capsmed evaluate {shell_quoted(summary.path)}"
            log.warning("%s: skipped, %s", summary.path, reason)
            skipped.append(SkippedRun(summary.path, reason))
            continue
        runs.append(load_evaluated_run(summary.path))
    return Collection(runs=runs, skipped=skipped)


@dataclass(frozen=True)
class Group:
    """The repetitions (seeds, folds) of one (dataset, architecture, protocol)."""

    dataset: str
    arch: str
    protocol: str
    settings: dict[str, Any]
    runs: tuple[EvaluatedRun, ...]

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.runs[0].class_names

    def stat(self, metric: str) -> Stat | None:
        """Mean +- std of an overall metric over the runs that report it."""
        values = [r.metrics[metric] for r in self.runs if metric in r.metrics]
        return describe(values) if values else None

    def metric_names(self) -> list[str]:
        return order_metrics({m for r in self.runs for m in r.metrics})


def order_metrics(names: Iterable[str]) -> list[str]:
    """The headline metrics first (paper 000's F1 leading), then the rest alphabetically."""
    names = set(names)
    return [m for m in METRIC_ORDER if m in names] + sorted(names - set(METRIC_ORDER))


def group_runs(runs: Sequence[EvaluatedRun], archs: Sequence[str] = ()) -> list[Group]:
    """Group runs by (dataset, arch, protocol); ``archs`` filters and orders architectures.

    Without ``archs`` architectures are in alphabetical order. Raises when runs of one
    dataset disagree on the class names (their per-class tables cannot be combined).
    """
    if archs:
        runs = [r for r in runs if r.arch in archs]
    runs = _tell_files_apart(runs)
    first_by_dataset: dict[str, EvaluatedRun] = {}
    for run in runs:
        first = first_by_dataset.setdefault(run.dataset, run)
        if run.class_names != first.class_names:
            raise CapsmedError(f"{run.path / 'report' / 'report.json'}: classes "
                               f"{list(run.class_names)} differ from "
                               f"{list(first.class_names)} in {first.path} (both dataset "
                               f"'{run.dataset}')")
    buckets: dict[tuple[str, str, str], list[EvaluatedRun]] = {}
    for run in runs:
        buckets.setdefault((run.dataset, run.arch, run.protocol), []).append(run)
    arch_rank = {a: i for i, a in enumerate(archs)}
    groups = [Group(d, a, p, members[0].settings,
                    tuple(sorted(members, key=lambda r: (r.seed, r.fold or -1, str(r.path)))))
              for (d, a, p), members in buckets.items()]
    groups.sort(key=lambda g: (g.dataset, protocol_sort_key(g.settings),
                               arch_rank.get(g.arch, math.inf), g.arch))
    return groups


def _tell_files_apart(runs: Sequence[EvaluatedRun]) -> list[EvaluatedRun]:
    """Runs of one dataset name trained on different files (a remade or edited file)
    are not repetitions of one experiment: their dataset label gains the file's name
    and digest, so they are grouped apart instead of averaged."""
    files: dict[str, set[str]] = {}
    for run in runs:
        files.setdefault(run.dataset, set()).add(run.data_file)
    out = []
    for run in runs:
        if len(files[run.dataset]) > 1:
            name = run.data_name
            digest = run.data_file.partition(":")[2][:8]
            label = f"{name} {digest}".strip() if digest else name
            run = replace(run, dataset=f"{run.dataset} [{label}]")
        out.append(run)
    return out


def group_warnings(groups: Sequence[Group]) -> list[str]:
    """Repetitions that are not like for like: differing settings, duplicated seeds."""
    notes = []
    for g in groups:
        where = f"{g.dataset} / {g.protocol} / {g.arch}"
        differing = sorted({k for r in g.runs for k in r.other
                            if any(r.other.get(k) != o.other.get(k) for o in g.runs)})
        if REVISION in differing:
            differing.remove(REVISION)
            revisions = sorted({r.other[REVISION] for r in g.runs})
            notes.append(f"{where}: runs of capsmed protocol revisions "
                         f"{', '.join(map(str, revisions))} are averaged together, but "
                         "capsmed changed what such a run computes between them "
                         "(capsmed/train/protocol.py); train the older runs again")
        if differing:
            notes.append(f"{where}: runs differ in {', '.join(differing)} but are averaged "
                         "together (group key is dataset, arch and protocol only)")
        late = [r for r in g.runs if r.unfinished]
        if late:
            notes.append(f"{where}: {len(late)} run(s) had not finished training ("
                         + "; ".join(f"{r.path}: {r.unfinished}" for r in late)
                         + "); their early checkpoints are averaged in and the cells "
                         "marked †; finish them with capsmed train --resume RUN_DIR (one "
                         "whose resumable state was removed: train it again), then "
                         "capsmed evaluate RUN_DIR")
        labels = [r.repetition_label for r in g.runs]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            notes.append(f"{where}: {', '.join(dupes)} appear(s) more than once; all are "
                         "averaged, none is used in paired tests")
    return notes
