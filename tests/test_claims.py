"""Paper claims as tests over a study's runs: a toy study whose claims are known to hold,
to fail and to be undecided gets each verdict, Holm-corrected together."""

from __future__ import annotations

import re

import numpy as np
import pytest

from capsmed.errors import CapsmedError
from capsmed.evaluate.claims import (
    claims_note,
    evaluate_claims,
    holm,
    judge_claims,
    parse_claims,
)

FRACTIONS = ["f5", "f10", "f20", "f50", "full"]


def _records(gap_at, noise=0.002, seeds=4, seed=0):
    """capsnet vs lenet F1 per fraction and seed: capsnet's lead is ``gap_at(i)``."""
    rng = np.random.default_rng(seed)
    out = []
    for i, condition in enumerate(FRACTIONS):
        for s in range(seeds):
            base = 0.8 + 0.04 * i + rng.normal(0, 0.01)
            for arch, value in (("lenet", base), ("capsnet", base + gap_at(i)),
                                ("baseline", base + 0.5 * gap_at(i))):
                out.append({"fields": {"dataset": "digits", "arch": arch,
                                       "condition": condition, "seed": s},
                            "metrics": {"macro_f1": value + rng.normal(0, noise)}})
    return out


CLAIMS = parse_claims([
    {"name": "better", "quote": "CapsNet performs better than LeNet and Baseline",
     "source": "paper 000, s4", "metric": "macro_f1", "better": {"arch": "capsnet"},
     "than": {"arch": ["lenet", "baseline"]}},
    {"name": "every-low-data", "quote": "... in almost all scenarios", "source": "s4",
     "metric": "macro_f1", "better": {"arch": "capsnet"}, "than": {"arch": "lenet"},
     "where": {"condition": ["f5", "f10"]}, "scope": "every"},
    {"name": "gap-shrinks", "quote": "the gap is higher for a small amount of data",
     "source": "s4", "metric": "macro_f1", "kind": "trend", "better": {"arch": "capsnet"},
     "than": {"arch": "lenet"}, "along": {"condition": FRACTIONS}},
], "study.yaml")


def test_claims_that_hold_fail_and_stay_undecided():
    shrinking = evaluate_claims(CLAIMS, _records(lambda i: 0.05 - 0.01 * i))
    assert [r.verdict for r in shrinking] == ["holds", "holds", "holds"]
    assert shrinking[0].effect > 0 and shrinking[2].effect < 0  # gap falls along fractions
    assert shrinking[0].pairs == 2 * 20  # 20 pairs per compared architecture
    reversed_ = evaluate_claims(CLAIMS, _records(lambda i: -0.05 + 0.01 * i))
    assert [r.verdict for r in reversed_] == ["fails", "fails", "fails"]
    noisy = evaluate_claims(CLAIMS, _records(lambda i: 0.0, noise=0.01, seed=3))
    assert all(r.verdict == "undecided" and r.note for r in noisy)
    assert claims_note(shrinking).startswith("3 of 3 claims hold, 0 fail, 0 undecided")


def test_every_needs_each_cell_and_too_few_pairs_decide_nothing():
    # capsnet ahead at f5 only: pooled over f5+f10 it may hold, cell by cell it cannot
    only_f5 = evaluate_claims(CLAIMS[1:2], _records(lambda i: 0.05 if i == 0 else 0.0))
    assert only_f5[0].verdict == "undecided"
    one_seed = evaluate_claims(CLAIMS[:1], _records(lambda i: 0.05, seeds=1)[:3])
    assert one_seed[0].verdict == "undecided" and "too few" in one_seed[0].note


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_number_leaves_its_claim_undecided_and_the_others_judged(bad):
    # a NaN (an analysis' JSON may hold one) made the claim's p-value NaN, and sorting
    # it in Holm's correction raised the other claims' adjusted p-values to 1
    good = _records(lambda i: 0.05)
    broken = _records(lambda i: 0.05)
    broken[1]["metrics"]["macro_f1"] = bad
    broken_first, good_second = judge_claims(CLAIMS[:2], [broken, good])
    assert good_second.verdict == "holds" and good_second.p_adjusted < 0.05
    assert broken_first.verdict == "undecided" and broken_first.p_value is None
    assert "NaN or infinite macro_f1" in broken_first.note


def test_rounding_noise_is_no_difference_and_decides_nothing():
    # two runs with the same per-class F1s in another class order: their macro F1s
    # differ by 1e-16, which was taken as a difference without spread (p = 0, "fails")
    f1s = [42 / 65, 40 / 65, 26 / 53, 0.28]
    records = []
    for seed in range(4):
        reordered = f1s[:2] + f1s[2:][::-1] if seed == 0 else f1s
        records += [{"fields": {"arch": "capsnet", "seed": seed},
                     "metrics": {"macro_f1": float(np.mean(f1s))}},
                    {"fields": {"arch": "lenet", "seed": seed},
                     "metrics": {"macro_f1": float(np.mean(reordered))}}]
    claim = parse_claims([{"name": "x", "quote": "q", "source": "s", "metric": "macro_f1",
                           "better": {"arch": "capsnet"}, "than": {"arch": "lenet"}}], "s")
    result, = evaluate_claims(claim, records)
    assert result.pairs == 4 and result.effect != 0.0  # the rounding is there
    assert result.verdict == "undecided" and result.p_value == 1.0


def test_a_constant_gap_is_no_trend_and_leaves_the_other_claims_alone():
    # capsnet predicting what lenet predicts in every run: the gap is 0 everywhere, the
    # slope's p-value NaN, and Holm's correction of the other claims depended on their order
    records = _records(lambda i: 0.05)
    lenet = {(r["fields"]["condition"], r["fields"]["seed"]): r["metrics"]["macro_f1"]
             for r in records if r["fields"]["arch"] == "lenet"}
    for r in records:
        if r["fields"]["arch"] == "capsnet":
            r["metrics"]["macro_f1"] = lenet[r["fields"]["condition"], r["fields"]["seed"]]
    beats_baseline = parse_claims([{
        "name": "b", "quote": "q", "source": "s", "metric": "macro_f1",
        "better": {"arch": "capsnet"}, "than": {"arch": "baseline"}}], "s")[0]
    for claims in ([CLAIMS[2], beats_baseline], [beats_baseline, CLAIMS[2]]):
        by_name = {r.claim.name: r for r in evaluate_claims(claims, records)}
        assert by_name["b"].verdict == "fails"  # baseline is lenet + 0.025
        trend = by_name["gap-shrinks"]
        assert trend.verdict == "undecided" and trend.p_value == 1.0 and trend.effect == 0


def test_one_cell_the_other_way_is_corrected_for_the_cells_before_failing_a_claim():
    # "every" fails when one cell goes the other way; that cell's smallest p was taken
    # as it stood, so with no difference at all some cell of many went "the other way"
    # at 0.05 far more often than 5 % of the time (about 40 % at 5 x 2 comparisons)
    gaps = {"f5": [-0.01, -0.02, 0.0, -0.01],  # one-sided p about 0.046 alone
            "f10": [0.01, -0.01, 0.01, -0.01]}  # no difference
    records = [{"fields": {"arch": arch, "condition": c, "seed": s},
                "metrics": {"macro_f1": 0.9 + (gap if arch == "capsnet" else 0.0)}}
               for c, values in gaps.items() for s, gap in enumerate(values)
               for arch in ("capsnet", "lenet")]
    result, = evaluate_claims(CLAIMS[1:2], records)
    assert result.p_opposite_adjusted == pytest.approx(2 * 0.0459, abs=0.002)
    assert result.verdict == "undecided"


def test_a_trend_over_two_convnets_needs_each_of_them_along_it():
    # with no baseline run finished the trend "capsnet - lenet and baseline" was decided
    # on lenet alone (holds, 20 pairs), where a "better" claim stays undecided
    trend = parse_claims([{"name": "t", "quote": "q", "source": "s", "metric": "macro_f1",
                           "kind": "trend", "better": {"arch": "capsnet"},
                           "than": {"arch": ["lenet", "baseline"]},
                           "along": {"condition": FRACTIONS}}], "s")
    records = _records(lambda i: 0.05 - 0.01 * i)
    assert evaluate_claims(trend, records)[0].verdict == "holds"
    for kept in ((), ("full",), ("f50", "full")):
        partial = [r for r in records if r["fields"]["arch"] != "baseline"
                   or r["fields"]["condition"] in kept]
        result, = evaluate_claims(trend, partial)
        assert result.verdict == "undecided" and result.p_value is None
        assert "each of its than values" in result.note


def test_every_cell_means_every_cell_with_runs_even_one_without_pairs():
    # lenet's f10 runs not finished: the f10 cell has no pairs and was left out, so
    # "in every cell" held on f5 alone, where one f10 pair would have left it undecided
    records = [r for r in _records(lambda i: 0.05)
               if not (r["fields"]["arch"] == "lenet" and r["fields"]["condition"] == "f10")]
    result, = evaluate_claims(CLAIMS[1:2], records)
    assert result.verdict == "undecided" and result.p_value is None
    assert evaluate_claims(CLAIMS[1:2], _records(lambda i: 0.05))[0].verdict == "holds"


def test_holm_adjusts_in_order_and_keeps_missing_values():
    assert holm([0.01, None, 0.04, 0.03]) == pytest.approx([0.03, None, 0.06, 0.06])


@pytest.mark.parametrize("item, message", [
    ({"name": "x", "quote": "q", "source": "s", "metric": "f1", "better": {"arch": "a"},
      "than": {"arch": "b"}, "scopee": "every"}, "unknown key(s) scopee"),
    ({"name": "x", "quote": "q", "source": "s", "metric": "f1", "better": {"arch": "a"}},
     "missing than"),
    ({"name": "x", "quote": "q", "source": "s", "metric": "f1", "better": {"arch": "a"},
      "than": {"seed": "b"}}, "same field"),
    ({"name": "x", "quote": "q", "source": "s", "metric": "f1", "better": {"arch": "a"},
      "than": {"arch": "b"}, "kind": "trend", "along": {"condition": ["f5", "f10"]}},
     "3 or more values"),
    # options of the other kind were dropped without a word: a per-cell trend was
    # tested pooled, a "better" claim's direction was never read
    ({"name": "x", "quote": "q", "source": "s", "metric": "f1", "better": {"arch": "a"},
      "than": {"arch": "b"}, "kind": "trend", "scope": "every",
      "along": {"condition": ["f5", "f10", "f20"]}}, "scope: every: only for a better"),
    ({"name": "x", "quote": "q", "source": "s", "metric": "f1", "better": {"arch": "a"},
      "than": {"arch": "b"}, "direction": "increasing"}, "direction: only for a trend"),
    ({"name": "x", "quote": "q", "source": "s", "metric": "f1", "better": {"arch": "a"},
      "than": {"arch": "b"}, "along": {"condition": ["f5", "f10", "f20"]}},
     "along: only for a trend"),
    # key without file read report.json's metric instead; evaluation with file, the file
    ({"name": "x", "quote": "q", "source": "s", "metric": "f1", "better": {"arch": "a"},
      "than": {"arch": "b"}, "key": "factors.scale.score"}, "key is a path in file:"),
    ({"name": "x", "quote": "q", "source": "s", "metric": "f1", "better": {"arch": "a"},
      "than": {"arch": "b"}, "file": "analysis/m/m.json", "evaluation": "report-affnist"},
     "evaluation names a report.json"),
])
def test_malformed_claims_are_refused_naming_them(item, message):
    with pytest.raises(CapsmedError, match=r"study.yaml: claims\[0\]: .*" + re.escape(message)):
        parse_claims([item], "study.yaml")
