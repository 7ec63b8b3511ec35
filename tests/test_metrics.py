"""Per-class metrics and AUC against hand-computed confusion matrices and scores."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import (
    balanced_accuracy_score,
    f1_score,
    precision_recall_fscore_support,
    roc_auc_score,
)

from capsmed.evaluate.metrics import classification_report
from capsmed.runs.scores import class_probabilities


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
    assert all(np.isfinite(v) for v in r.total.values() if v is not None)
    assert r.total["auc"] is None  # no scores given


def test_class_absent_from_test_set_is_defined_and_noted():
    r = classification_report(np.array([0, 0, 1]), np.array([0, 1, 1]), ["a", "b", "c"])
    assert r.per_class["c"]["support"] == 0
    assert r.per_class["c"]["specificity"] == pytest.approx(1.0)
    assert r.balanced_accuracy == pytest.approx((0.5 + 1.0) / 2)  # absent class left out
    assert any("'c' has no samples" in n for n in r.notes)


def test_absent_and_never_predicted_classes_are_null_or_conventional_never_nan():
    # a: normal; b: predicted too often; c: present, never predicted;
    # d: absent, predicted once; e: absent, never predicted
    y_true = np.array([0, 0, 0, 1, 1, 2, 2])
    y_pred = np.array([0, 0, 1, 1, 3, 1, 1])
    r = classification_report(y_true, y_pred, ["a", "b", "c", "d", "e"])
    assert r.confusion.tolist() == [[2, 1, 0, 0, 0], [0, 1, 0, 1, 0], [0, 2, 0, 0, 0],
                                    [0] * 5, [0] * 5]
    a, b, c, d, e = (r.per_class[k] for k in "abcde")
    assert (a["precision"], a["sensitivity"], a["specificity"]) == pytest.approx((1, 2 / 3, 1))
    assert a["f1"] == pytest.approx(0.8)
    assert (b["precision"], b["sensitivity"], b["specificity"]) == pytest.approx((1 / 4, 1 / 2,
                                                                                  2 / 5))
    assert b["f1"] == pytest.approx(1 / 3)  # 2TP / (2TP + FP + FN) = 2 / 6
    assert (c["precision"], c["sensitivity"], c["specificity"], c["f1"]) == (0.0, 0.0, 1.0, 0.0)
    assert d["precision"] == 0.0 and d["sensitivity"] is None and d["f1"] == 0.0
    assert d["specificity"] == pytest.approx(6 / 7)
    assert e["precision"] is None and e["sensitivity"] is None and e["f1"] is None
    assert e["specificity"] == 1.0 and e["support"] == 0
    assert r.total["precision"] == pytest.approx((1 + 0.25 + 0 + 0) / 4)  # e left out
    assert r.total["sensitivity"] == pytest.approx((2 / 3 + 1 / 2 + 0) / 3)
    assert r.balanced_accuracy == r.total["sensitivity"]
    assert r.total["specificity"] == pytest.approx((1 + 0.4 + 1 + 6 / 7 + 1) / 5)
    assert r.macro_f1 == r.total["f1"] == pytest.approx((0.8 + 1 / 3 + 0 + 0) / 4)
    assert r.weighted_f1 == pytest.approx((3 * 0.8 + 2 / 3 + 0) / 7)
    assert r.accuracy == pytest.approx(3 / 7)
    assert r.auc is None and r.auc_method is None  # no scores given
    notes = " ".join(r.notes)
    assert "'c' was never predicted: precision reported as 0" in notes
    assert "'d' has no samples: its sensitivity is undefined (null)" in notes
    assert "'e' has no samples: its sensitivity, precision and F1 are undefined" in notes
    text = json.dumps(r.to_dict(), allow_nan=False)  # raises on any NaN
    assert json.loads(text)["per_class"]["e"]["precision"] is None


def test_matches_scikit_learn_where_everything_is_defined():
    rng = np.random.default_rng(0)
    y_true = rng.integers(0, 4, 200)
    logits = rng.normal(size=(200, 4)) + 1.5 * np.eye(4)[y_true]
    probs, _ = class_probabilities(logits, "ce")
    y_pred = probs.argmax(axis=1)
    r = classification_report(y_true, y_pred, list("abcd"), scores=probs)
    p, rec, f1, _ = precision_recall_fscore_support(y_true, y_pred)
    for k, name in enumerate("abcd"):
        assert r.per_class[name]["precision"] == pytest.approx(p[k])
        assert r.per_class[name]["sensitivity"] == pytest.approx(rec[k])
        assert r.per_class[name]["f1"] == pytest.approx(f1[k])
        assert r.per_class[name]["auc"] == pytest.approx(roc_auc_score(y_true == k, probs[:, k]))
    assert r.balanced_accuracy == pytest.approx(balanced_accuracy_score(y_true, y_pred))
    assert r.macro_f1 == pytest.approx(f1_score(y_true, y_pred, average="macro"))
    assert r.weighted_f1 == pytest.approx(f1_score(y_true, y_pred, average="weighted"))
    assert r.auc == pytest.approx(roc_auc_score(y_true, probs, multi_class="ovr"))
    assert r.auc_method == "one-vs-rest macro ROC AUC over 4 of 4 classes"


def test_binary_auc_by_hand():
    # positives score 0.35 and 0.8, negatives 0.1 and 0.4: 3 of the 4 pairs ordered
    y = np.array([0, 0, 1, 1])
    p1 = np.array([0.1, 0.4, 0.35, 0.8])
    r = classification_report(y, (p1 > 0.5).astype(int), ["neg", "pos"],
                              scores=np.c_[1 - p1, p1])
    assert r.auc == pytest.approx(0.75) and r.per_class["pos"]["auc"] == pytest.approx(0.75)
    assert r.per_class["neg"]["auc"] == pytest.approx(0.75)
    assert r.auc_method == "ROC AUC of the positive class 'pos'"


def test_multiclass_auc_with_a_class_absent_from_the_split():
    y = np.array([0, 0, 1, 1])
    scores = np.array([[0.9, 0.1, 0.0], [0.3, 0.5, 0.2], [0.4, 0.5, 0.1], [0.2, 0.7, 0.1]])
    r = classification_report(y, scores.argmax(axis=1), ["a", "b", "c"], scores=scores)
    # a: 0.9 beats 0.4 and 0.2, 0.3 beats 0.2 only -> 3/4
    # b: 0.7 beats 0.1 and 0.5, 0.5 beats 0.1 and ties 0.5 (counts 1/2) -> 3.5/4
    assert r.per_class["a"]["auc"] == pytest.approx(0.75)
    assert r.per_class["b"]["auc"] == pytest.approx(0.875)
    assert r.per_class["c"]["auc"] is None
    assert r.auc == r.total["auc"] == pytest.approx((0.75 + 0.875) / 2)
    assert r.auc_method == "one-vs-rest macro ROC AUC over 2 of 3 classes"
    assert any("'c': AUC undefined (null)" in n for n in r.notes)


def test_non_finite_scores_leave_auc_null_with_a_note():
    scores = np.array([[0.2, 0.8], [np.nan, 0.1], [0.6, 0.4]])
    r = classification_report(np.array([1, 0, 0]), np.array([1, 1, 0]), ["a", "b"],
                              scores=scores)
    assert r.auc is None and all(v["auc"] is None for v in r.per_class.values())
    assert any("NaN or inf" in n for n in r.notes)
    json.dumps(r.to_dict(), allow_nan=False)


def test_a_split_where_every_sample_is_one_class():
    r = classification_report(np.array([1, 1, 1]), np.array([1, 0, 1]), ["a", "b"],
                              scores=np.array([[0.1, 0.9], [0.7, 0.3], [0.2, 0.8]]))
    assert r.per_class["b"]["specificity"] is None and r.per_class["b"]["auc"] is None
    assert r.per_class["a"]["specificity"] == pytest.approx(2 / 3)
    assert r.auc is None and r.accuracy == pytest.approx(2 / 3)
    assert any("every sample is class 'b'" in n for n in r.notes)


def test_empty_split_does_not_crash():
    r = classification_report(np.array([], int), np.array([], int), ["a", "b"])
    assert r.accuracy is None and r.balanced_accuracy is None and r.weighted_f1 is None
    assert r.confusion.tolist() == [[0, 0], [0, 0]]
    json.dumps(r.to_dict(), allow_nan=False)


def test_class_probabilities_softmax_for_logits_only():
    logits = np.array([[2.0, 0.0, -1.0]])
    probs, how = class_probabilities(logits, "ce")
    assert probs.sum() == pytest.approx(1.0) and how == "softmax of the logits"
    assert probs[0, 0] == pytest.approx(np.exp(2) / (np.exp(2) + 1 + np.exp(-1)))
    lengths = np.array([[0.9, 0.3, 0.05]])
    same, how = class_probabilities(lengths, "margin")
    assert np.array_equal(same, lengths) and "unnormalised" in how


@pytest.mark.parametrize(("y_true", "y_pred"), [([0, 1, 2], [0, 1, 1]), ([0, 1, 1], [0, 1, 5]),
                                                ([0, -1, 1], [0, 1, 1])])
def test_labels_outside_the_classes_are_refused_not_dropped(y_true, y_pred):
    # sklearn's confusion_matrix(labels=...) leaves such samples out: accuracy 1.0 on a
    # split with a wrong prediction
    with pytest.raises(ValueError, match="outside 0..1"):
        classification_report(np.array(y_true), np.array(y_pred), ["a", "b"])
