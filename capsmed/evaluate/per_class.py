"""Per-class summaries of a group's runs: pooled (paper 001 Table 2) or mean +- std.

Paper 001 sums the confusion matrices of its 5 CV folds and computes precision and
sensitivity once, so every image counts once and rare classes are not averaged over
folds that hold one or two of their images. The mean over runs is the alternative
(with a spread); the two differ whenever the runs' denominators differ.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from capsmed.evaluate.aggregate import EvaluatedRun, Stat, describe


def pooled_per_class(runs: Sequence[EvaluatedRun]) -> dict[str, Any]:
    """Paper 001 Table 2: sum the runs' confusion matrices, then PRE and SEN per class.

    Over CV folds every image is tested once, so this is the whole dataset's table
    (except under ``--per-class-limit``, whose images beyond the limit are tested by
    every fold and counted once per fold). The
    conventions are ``capsmed evaluate``'s: precision is 0 for a class present but never
    predicted and undefined (None) for one neither present nor predicted; sensitivity
    is undefined without samples; the Total row is the unweighted mean over the classes
    where the value is defined.
    """
    cm = np.sum([r.confusion for r in runs], axis=0)
    names = runs[0].class_names
    per_class, notes = {}, []
    for k, name in enumerate(names):
        tp, predicted, actual = int(cm[k, k]), int(cm[:, k].sum()), int(cm[k].sum())
        precision = tp / predicted if predicted else (0.0 if actual else None)
        if not predicted and actual:
            notes.append(f"class '{name}' was never predicted: pooled precision reported "
                         "as 0")
        if not actual:
            notes.append(f"class '{name}' has no samples: pooled sensitivity undefined")
        per_class[name] = {"precision": precision,
                           "sensitivity": tp / actual if actual else None, "support": actual}
    total = {key: _defined_mean([v[key] for v in per_class.values()])
             for key in ("precision", "sensitivity")}
    return {"per_class": per_class, "total": {**total, "support": int(cm.sum())},
            "confusion_matrix": cm.tolist(), "notes": notes}


def _defined_mean(values: Sequence[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return float(np.mean(defined)) if defined else None


def _describe_defined(values: Iterable[float | None]) -> Stat | None:
    defined = [v for v in values if v is not None]
    return describe(defined) if defined else None


def mean_per_class(runs: Sequence[EvaluatedRun]) -> dict[str, Any]:
    """Per-class metrics as mean +- std over the runs (the alternative to pooling).

    A run where a value is undefined does not count towards that value's mean (its n is
    smaller). The Total row is each run's macro average (the unweighted class mean),
    averaged over the runs.
    """
    names = runs[0].class_names
    keys = sorted({k for r in runs for values in r.per_class.values() for k in values})
    per_class = {n: {k: _describe_defined(r.per_class[n].get(k) for r in runs)
                     for k in keys} for n in names}
    support = np.sum([r.confusion.sum(axis=1) for r in runs], axis=0)
    total = {k: _describe_defined(r.metrics.get(f"macro_{k}") for r in runs) for k in keys}
    return {"per_class": per_class, "total": total,
            "support": {n: int(support[i]) for i, n in enumerate(names)}}
