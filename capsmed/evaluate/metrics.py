"""Per-class and overall classification metrics, computed with scikit-learn.

Per class: precision, sensitivity (recall), specificity, F1, support; a Total row
with the unweighted (macro) mean over classes, as paper 001 Table 2; overall
accuracy and balanced accuracy (paper 001's "WAcc": mean per-class sensitivity).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

COLUMNS = ("precision", "sensitivity", "specificity", "f1", "support")


@dataclass(frozen=True)
class ClassificationReport:
    """Metrics for one set of predictions."""

    class_names: tuple[str, ...]
    per_class: dict[str, dict[str, float]]
    total: dict[str, float]
    accuracy: float
    balanced_accuracy: float
    confusion: np.ndarray
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"class_names": list(self.class_names), "per_class": self.per_class,
                "total": self.total, "accuracy": self.accuracy,
                "balanced_accuracy": self.balanced_accuracy,
                "confusion_matrix": self.confusion.tolist(), "notes": self.notes}


def classification_report(y_true: np.ndarray, y_pred: np.ndarray,
                          class_names: Sequence[str]) -> ClassificationReport:
    """Compute the per-class report; undefined ratios (0/0) are reported as 0 with a note."""
    labels = np.arange(len(class_names))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 0/0 cases are handled and noted below
        precision, recall, f1, support = precision_recall_fscore_support(
            y_true, y_pred, labels=labels, zero_division=0)
    cm = confusion_matrix(y_true, y_pred, labels=labels)
    tp = np.diag(cm).astype(float)
    fp = cm.sum(axis=0) - tp
    fn = cm.sum(axis=1) - tp
    tn = cm.sum() - tp - fp - fn
    specificity = np.divide(tn, tn + fp, out=np.zeros_like(tn), where=(tn + fp) > 0)
    notes = []
    for k, name in enumerate(class_names):
        if support[k] == 0:
            notes.append(f"class '{name}' has no samples: its sensitivity is undefined "
                         "(reported as 0) and it is left out of balanced accuracy")
        elif tp[k] + fp[k] == 0:
            notes.append(f"class '{name}' was never predicted: precision reported as 0")
    per_class = {name: {"precision": float(precision[k]), "sensitivity": float(recall[k]),
                        "specificity": float(specificity[k]), "f1": float(f1[k]),
                        "support": int(support[k])}
                 for k, name in enumerate(class_names)}
    total = {key: float(np.mean([row[key] for row in per_class.values()]))
             for key in COLUMNS if key != "support"}
    total["support"] = int(support.sum())
    present = support > 0
    balanced = float(recall[present].mean()) if present.any() else 0.0
    return ClassificationReport(
        class_names=tuple(class_names), per_class=per_class, total=total,
        accuracy=float(accuracy_score(y_true, y_pred)) if len(y_true) else 0.0,
        balanced_accuracy=balanced, confusion=cm, notes=notes)
