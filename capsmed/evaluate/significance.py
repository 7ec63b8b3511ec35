"""Paired significance tests between architectures trained under the same protocol.

Paper 000 reports differences as significant at p < 0.05. Two architectures' runs are
paired when they share the dataset, the protocol and the repetition (seed and fold):
the same seed picks the same training subset, and the same fold the same test images,
so the difference within a pair removes that source of variance. Runs without a
partner are left out, and the report says which.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any

import numpy as np
from scipy import stats

from capsmed.evaluate.aggregate import Group

TESTS = ("ttest", "wilcoxon")
TEST_NAMES = {"ttest": "paired t-test", "wilcoxon": "Wilcoxon signed-rank test"}


@dataclass(frozen=True)
class PairedTest:
    """One comparison of architecture A against B on one metric.

    ``p_value`` is None ("n/a") when it cannot be computed: fewer than two pairs, or
    differences that are all zero.
    """

    dataset: str
    protocol: str
    arch_a: str
    arch_b: str
    metric: str
    test: str
    n: int
    mean_a: float | None
    mean_b: float | None
    mean_difference: float | None
    statistic: float | None
    p_value: float | None
    significant: bool | None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FEW_PAIRS = "cannot reach p < 0.05"  # the note of a Wilcoxon test on too few pairs


def wilcoxon_min_p(n: int) -> float:
    """The smallest two-sided p an exact Wilcoxon signed-rank test can give for n pairs."""
    return 2.0 / 2**n


def paired_p_value(a: Sequence[float], b: Sequence[float],
                   test: str = "ttest") -> tuple[float | None, float | None, str]:
    """``(statistic, p, note)`` of a two-sided paired test of ``a`` against ``b``."""
    if test not in TESTS:
        raise ValueError(f"test must be one of {TESTS}, got {test!r}")
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) < 2:
        return None, None, f"n/a: {len(x)} matched pair(s), a paired test needs 2 or more"
    d = _exact_differences(x, y)
    if not d.any():
        return None, None, "n/a: the architectures scored the same in every pair"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate inputs are caught below
        try:  # ttest_1samp of the differences is ttest_rel of the pairs
            result = (stats.ttest_1samp(d, 0.0) if test == "ttest" else stats.wilcoxon(d))
        except ValueError as exc:
            return None, None, f"n/a: {exc}"
    statistic, p = float(result.statistic), float(result.pvalue)
    if not math.isfinite(p):
        return None, None, "n/a: the test is undefined for these values"
    # every pair differs by the same amount: t is +-inf
    equal = np.ptp(d) == 0
    if not math.isfinite(statistic) or (test == "ttest" and equal):
        statistic = None
    note = ""
    ranked = int(np.count_nonzero(d))  # the signed-rank test drops zero differences
    if test == "wilcoxon" and wilcoxon_min_p(ranked) >= 0.05:
        pairs = (f"{len(x)} pairs" if ranked == len(x) else
                 f"{ranked} non-zero differences (of {len(x)} pairs)")
        note = (f"with {pairs} the Wilcoxon test {FEW_PAIRS} (smallest possible p = "
                f"{wilcoxon_min_p(ranked):.4g}); it needs n >= 6")
    elif test == "ttest" and equal:
        note = "every pair differs by the same amount: the t statistic is degenerate"
    return statistic, p, note


def p_decimals(p: float, alpha: float, digits: int) -> str:
    """``p`` in ``digits`` decimals, more where ``digits`` would round it across
    ``alpha`` (0.04996 is not shown 0.0500 beside a mark of p < 0.05)."""
    text = f"{p:.{digits}f}"
    while (float(text) < alpha) != (p < alpha) and digits < 17:
        digits += 1
        text = f"{p:.{digits}f}"
    return text


def _exact_differences(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x - y`` without the rounding noise of the metrics' arithmetic: 0.7 - 0.5 and
    0.7 - 0.9 are 0.19999999999999996 and -0.20000000000000007, so the signed-rank
    test ranked equal differences apart (a made-up p), and macro means equal but for
    their last bit (mean(0.1, 0.5) and mean(0.2, 0.4)) made a t-test of pure noise.
    Differences are rounded to 1e-9 of the largest score, far below any real one."""
    step = 1e-9 * float(np.abs(np.concatenate([x, y])).max())
    d = x - y
    return np.round(d / step) * step + 0.0 if step > 0 else d  # + 0.0: no -0.0


def paired_tests(groups: Sequence[Group], metric: str, test: str = "ttest",
                 alpha: float = 0.05) -> tuple[list[PairedTest], list[str]]:
    """Every pair of architectures within each (dataset, protocol), on ``metric``.

    Args:
        groups: From :func:`capsmed.evaluate.aggregate.group_runs` (their order is kept).
        metric: An overall metric name (``macro_f1``, ``accuracy``, ...).
        test: ``ttest`` (scipy ``ttest_rel``) or ``wilcoxon`` (scipy ``wilcoxon``).
        alpha: Significance level; ``significant`` is ``p < alpha``.

    Returns:
        The tests, and notes about runs left out (unmatched or duplicated repetitions).
    """
    by_setting: dict[tuple[str, str], list[Group]] = {}
    for g in groups:
        by_setting.setdefault((g.dataset, g.protocol), []).append(g)
    results, notes = [], []
    for (dataset, protocol), members in by_setting.items():
        for ga, gb in combinations(members, 2):
            va, vb = _by_repetition(ga, metric), _by_repetition(gb, metric)
            shared = sorted(set(va) & set(vb), key=lambda r: (r[0], r[1] or -1))
            where = f"{dataset} / {protocol}: {ga.arch} vs {gb.arch}"
            for g, values in ((ga, va), (gb, vb)):
                left = sorted(_label(r) for r in set(values) - set(shared))
                if left:
                    notes.append(f"{where}: {g.arch} {', '.join(left)} left out (no "
                                 "matching run of the other architecture)")
            a = [va[r] for r in shared]
            b = [vb[r] for r in shared]
            statistic, p, note = paired_p_value(a, b, test)
            if note and p is not None:
                notes.append(f"{where}: {note}")
            results.append(PairedTest(
                dataset=dataset, protocol=protocol, arch_a=ga.arch, arch_b=gb.arch,
                metric=metric, test=test, n=len(shared),
                mean_a=float(np.mean(a)) if a else None,
                mean_b=float(np.mean(b)) if b else None,
                mean_difference=float(np.mean(np.subtract(a, b))) if a else None,
                statistic=statistic, p_value=p,
                significant=None if p is None else bool(p < alpha), note=note))
    return results, notes


def _label(repetition: tuple[int, int | None]) -> str:
    seed, fold = repetition
    return f"seed {seed}" + (f" fold {fold}" if fold is not None else "")


def _by_repetition(group: Group, metric: str) -> dict[tuple[int, int | None], float]:
    """Metric value per (seed, fold); repeated repetitions are ambiguous and dropped."""
    counts: dict[tuple[int, int | None], int] = {}
    for run in group.runs:
        counts[run.repetition] = counts.get(run.repetition, 0) + 1
    return {r.repetition: r.metrics[metric] for r in group.runs
            if counts[r.repetition] == 1 and metric in r.metrics}
