"""Per-class metrics against hand-computed confusion matrices."""

from __future__ import annotations

import numpy as np
import pytest

from capsmed.evaluate.metrics import classification_report


def test_binary_report_matches_hand_counts():
    # true:  0 0 0 0 1 1 1 1 1 1 ; pred: 0 0 0 1 1 1 1 1 0 0
    y_true = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    y_pred = np.array([0, 0, 0, 1, 1, 1, 1, 1, 0, 0])
    r = classification_report(y_true, y_pred, ["healthy", "lesion"])
    # lesion: TP 4, FP 1, FN 2, TN 3
    les = r.per_class["lesion"]
    assert les["precision"] == pytest.approx(4 / 5)
    assert les["sensitivity"] == pytest.approx(4 / 6)
    assert les["specificity"] == pytest.approx(3 / 4)
    assert les["f1"] == pytest.approx(2 * 0.8 * (4 / 6) / (0.8 + 4 / 6))
    assert les["support"] == 6
    hea = r.per_class["healthy"]
    assert hea["precision"] == pytest.approx(3 / 5) and hea["sensitivity"] == pytest.approx(3 / 4)
    assert r.total["precision"] == pytest.approx((0.8 + 0.6) / 2)
    assert r.total["support"] == 10
    assert r.accuracy == pytest.approx(0.7)
    assert r.balanced_accuracy == pytest.approx((3 / 4 + 4 / 6) / 2)
    assert r.confusion.tolist() == [[3, 1], [2, 4]]


def test_class_never_predicted_is_zero_with_a_note():
    r = classification_report(np.array([0, 1, 2, 2]), np.array([0, 1, 1, 1]), ["a", "b", "c"])
    assert r.per_class["c"]["precision"] == 0.0 and r.per_class["c"]["sensitivity"] == 0.0
    assert any("'c' was never predicted" in n for n in r.notes)
    assert not np.isnan(list(r.total.values())).any()


def test_class_absent_from_test_set_is_defined_and_noted():
    r = classification_report(np.array([0, 0, 1]), np.array([0, 1, 1]), ["a", "b", "c"])
    assert r.per_class["c"]["support"] == 0
    assert r.per_class["c"]["specificity"] == pytest.approx(1.0)
    assert r.balanced_accuracy == pytest.approx((0.5 + 1.0) / 2)  # absent class left out
    assert any("'c' has no samples" in n for n in r.notes)
