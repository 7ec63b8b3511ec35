"""Paper claims as tests over a study's runs: a toy study whose claims are known to hold,
to fail and to be undecided gets each verdict, Holm-corrected together."""

from __future__ import annotations

import re

import numpy as np
import pytest

from capsmed.errors import CapsmedError
from capsmed.evaluate.claims import claims_note, evaluate_claims, holm, parse_claims

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
])
def test_malformed_claims_are_refused_naming_them(item, message):
    with pytest.raises(CapsmedError, match=r"study.yaml: claims\[0\]: .*" + re.escape(message)):
        parse_claims([item], "study.yaml")
