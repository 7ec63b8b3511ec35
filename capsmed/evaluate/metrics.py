"""Per-class and overall classification metrics.

Per class: precision, sensitivity (recall), specificity, F1, support and, when class
scores are given, one-vs-rest ROC AUC; a Total row with the unweighted (macro) mean over
classes, as paper 001 Table 2; overall accuracy, balanced accuracy (paper 001's "WAcc",
the mean per-class sensitivity), macro and support-weighted F1, and AUC.

Undefined values are ``None`` (JSON ``null``) with a note, never NaN and never a silent
0, with one exception kept from the usual convention (scikit-learn's
``zero_division=0``): a class that has samples but is never predicted gets precision 0,
so a model that ignores a class is penalised in the macro precision instead of having
that class left out of it. The rules, per class with counts TP, FP, FN, TN:

* precision = TP / (TP + FP); 0 when never predicted but present; null when the class is
  neither present nor predicted.
* sensitivity = TP / (TP + FN); null when the class has no samples.
* specificity = TN / (TN + FP); null when every sample belongs to the class.
* F1 = 2TP / (2TP + FP + FN) (the harmonic mean of precision and sensitivity whenever both
  are defined); null when the class is neither present nor predicted.
* AUC: null when the class has no samples or no other class has any (ROC needs both).

A macro mean (the Total row) is taken over the classes where the value is defined.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from sklearn.metrics import confusion_matrix, roc_auc_score

# The per-class table: ratio columns (may be None) then the sample count.
RATIOS = ("precision", "sensitivity", "specificity", "f1", "auc")
COLUMNS = (*RATIOS, "support")


@dataclass(frozen=True)
class ClassificationReport:
    """Metrics for one set of predictions; ``None`` marks an undefined value.

    Attributes:
        class_names: Class names in label order.
        per_class: ``{class: {precision, sensitivity, specificity, f1, auc, support}}``.
        total: The macro (unweighted) mean of each column over classes where it is
            defined; ``support`` is the number of samples.
        accuracy: Share of samples predicted correctly (paper 001's Acc).
        balanced_accuracy: Mean sensitivity over the classes present (paper 001's WAcc).
        macro_f1: Mean F1 over classes where it is defined (= ``total["f1"]``).
        weighted_f1: F1 averaged with each class weighted by its support.
        auc: Binary: ROC AUC of the positive class (label 1); multi-class: the
            one-vs-rest macro AUC over classes where it is defined; None without scores.
        auc_method: How ``auc`` was computed, in words.
        confusion: Counts [true, predicted].
        notes: Why a value is undefined or conventional, one sentence each.
        predictions_digest: SHA-256 (first 16 hex digits) of the predicted labels as
            int64: two evaluations with the same digest predicted the same labels.
    """

    class_names: tuple[str, ...]
    per_class: dict[str, dict[str, float | int | None]]
    total: dict[str, float | int | None]
    accuracy: float | None
    balanced_accuracy: float | None
    confusion: np.ndarray
    notes: list[str] = field(default_factory=list)
    macro_f1: float | None = None
    weighted_f1: float | None = None
    auc: float | None = None
    auc_method: str | None = None
    predictions_digest: str | None = None

    def summary(self) -> dict[str, float | None]:
        """The overall numbers, by name."""
        return {"accuracy": self.accuracy, "balanced_accuracy": self.balanced_accuracy,
                "macro_f1": self.macro_f1, "weighted_f1": self.weighted_f1, "auc": self.auc}

    def to_dict(self) -> dict:
        return {"class_names": list(self.class_names), "per_class": self.per_class,
                "total": self.total, **self.summary(), "auc_method": self.auc_method,
                "confusion_matrix": self.confusion.tolist(), "notes": self.notes,
                "predictions_digest": self.predictions_digest}


def _ratio(num: float, den: float) -> float | None:
    return float(num / den) if den > 0 else None


def _mean(values: Sequence[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return float(np.mean(defined)) if defined else None


def _per_class_auc(y_true: np.ndarray, scores: np.ndarray, class_names: Sequence[str],
                   notes: list[str]) -> list[float | None]:
    if scores.shape != (len(y_true), len(class_names)):
        raise ValueError(f"scores have shape {scores.shape}, expected "
                         f"({len(y_true)}, {len(class_names)})")
    if not np.isfinite(scores).all():
        notes.append("the class scores contain NaN or inf: AUC not computed")
        return [None] * len(class_names)
    aucs: list[float | None] = []
    for k, name in enumerate(class_names):
        positive = y_true == k
        if positive.all() or not positive.any():
            aucs.append(None)
            reason = "no samples" if not positive.any() else "every sample"
            notes.append(f"class '{name}': AUC undefined (null) because the split has "
                         f"{reason} of it")
        else:
            aucs.append(float(roc_auc_score(positive, scores[:, k])))
    return aucs


def classification_report(y_true: np.ndarray, y_pred: np.ndarray,
                          class_names: Sequence[str],
                          scores: np.ndarray | None = None) -> ClassificationReport:
    """Compute the per-class report and the overall metrics.

    Args:
        y_true: True labels [N] in ``0..K-1``.
        y_pred: Predicted labels [N].
        class_names: The K class names.
        scores: Optional per-class scores [N, K] for AUC (see
            :func:`capsmed.runs.scores.class_probabilities`).

    Returns:
        The report; undefined values are None and explained in ``notes``.

    Raises:
        ValueError: A true or predicted label is not a class index (its sample would
            be left out of every count).
    """
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    labels = np.arange(len(class_names))
    for what, values in (("true", y_true), ("predicted", y_pred)):
        # confusion_matrix(labels=...) drops such samples without a word
        outside = values[~np.isin(values, labels)]
        if len(outside):
            raise ValueError(f"{len(outside)} {what} label(s) outside 0..{len(labels) - 1} "
                             f"(e.g. {outside[0]}) for {len(labels)} class names")
    cm = confusion_matrix(y_true, y_pred, labels=labels) if len(y_true) else \
        np.zeros((len(labels), len(labels)), dtype=np.int64)
    tp = np.diag(cm).astype(float)
    fp = cm.sum(axis=0) - tp
    fn = cm.sum(axis=1) - tp
    tn = cm.sum() - tp - fp - fn
    support = cm.sum(axis=1)
    notes: list[str] = []
    if not len(y_true):
        notes.append("no samples: every metric is undefined (null)")
    aucs = (_per_class_auc(y_true, scores, class_names, notes) if scores is not None
            else [None] * len(class_names))
    per_class: dict[str, dict[str, float | int | None]] = {}
    for k, name in enumerate(class_names):
        predicted = tp[k] + fp[k] > 0
        precision = _ratio(tp[k], tp[k] + fp[k])
        if not predicted and support[k] > 0:
            precision = 0.0
            notes.append(f"class '{name}' was never predicted: precision reported as 0")
        if support[k] == 0 and len(y_true):
            undefined = ("sensitivity is" if predicted
                         else "sensitivity, precision and F1 are")
            notes.append(f"class '{name}' has no samples: its {undefined} undefined "
                         "(null) and left out of the macro Total and balanced accuracy")
        if tn[k] + fp[k] == 0 and support[k] > 0:
            notes.append(f"every sample is class '{name}': its specificity is undefined "
                         "(null)")
        per_class[name] = {"precision": precision, "sensitivity": _ratio(tp[k], support[k]),
                           "specificity": _ratio(tn[k], tn[k] + fp[k]),
                           "f1": _ratio(2 * tp[k], 2 * tp[k] + fp[k] + fn[k]),
                           "auc": aucs[k], "support": int(support[k])}
    total: dict[str, float | int | None] = {
        key: _mean([row[key] for row in per_class.values()]) for key in RATIOS}
    total["support"] = int(support.sum())
    n = int(support.sum())
    # support-weighted: classes without samples weigh 0, and present classes always
    # have a defined F1 (FN + TP > 0)
    weighted_f1 = (float(sum(row["f1"] * row["support"] for row in per_class.values()
                             if row["support"]) / n) if n else None)
    auc, auc_method = None, None
    if scores is not None:
        if len(class_names) == 2:
            auc = per_class[class_names[1]]["auc"]
            auc_method = f"ROC AUC of the positive class '{class_names[1]}'"
        else:
            defined = sum(a is not None for a in aucs)
            auc = total["auc"]
            auc_method = (f"one-vs-rest macro ROC AUC over {defined} of "
                          f"{len(class_names)} classes")
    return ClassificationReport(
        class_names=tuple(class_names), per_class=per_class, total=total,
        accuracy=_ratio(float(tp.sum()), n), balanced_accuracy=total["sensitivity"],
        confusion=cm, notes=notes, macro_f1=total["f1"], weighted_f1=weighted_f1,
        auc=auc, auc_method=auc_method, predictions_digest=predictions_digest(y_pred))


def predictions_digest(y_pred: np.ndarray) -> str:
    """Which labels were predicted, in 16 hex digits (order and values)."""
    data = np.ascontiguousarray(np.asarray(y_pred, dtype=np.int64)).tobytes()
    return hashlib.sha256(data).hexdigest()[:16]
