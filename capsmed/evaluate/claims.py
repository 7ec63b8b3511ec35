"""Does a paper's claim still hold on our runs? One verdict per claim of a study.

A claim quotes the paper's sentence and states it as a comparison over runs, e.g. paper
000's "CapsNet performs better than LeNet and Baseline in almost all scenarios":

    - name: capsnet-beats-convnets
      quote: "CapsNet performs better than LeNet and Baseline in almost all scenarios"
      source: paper 000, s4
      metric: macro_f1
      better: {arch: capsnet}
      than: {arch: [lenet, baseline]}
      where: {condition: [f5, f10]}       # optional: the runs it speaks of
      scope: pooled                       # or: every (each cell on its own)

Runs are paired by everything but the compared field: the same dataset, condition and
seed (or fold), so a pair differs only in what the claim compares; ``ignore: [n]`` also
leaves out fields that change along with it (paper 001's networks each at their own
number of branches ``n``). The number compared is ``metric`` of each run's evaluation
``report`` (``evaluation:`` names another), or, with ``file:`` (an analysis' JSON in the
run folder), the number at ``key:`` (default: ``metric``) in it. Two kinds:

* **better** (default): the metric of ``better`` exceeds that of each ``than``. A one-
  sided paired t-test over the pairs (``scope: pooled``), or over each cell's pairs with
  the largest p-value standing for the claim (``scope: every``: an intersection-union
  test, the claim holds only if every cell does); several ``than`` values combine the
  same way. The opposite direction is the smallest such p-value times the number of
  comparisons (Bonferroni): one comparison going the other way makes the claim fail.
* **trend**: ``gap`` = better - than shrinks (``decreasing``) or grows along the values
  of ``along`` (e.g. training fractions in order): a one-sided t-test on the slope of
  the paired gaps against the position in ``along`` (each ``than`` value paired at 3 or
  more of them, else undecided).

The claims of one study are corrected together (Holm), and each gets a verdict:
**holds** (the corrected one-sided p-value < 0.05 in the claimed direction), **fails**
(the opposite direction is significant the same way), or **undecided** (neither; or
fewer than 2 pairs). The effect reported is the mean paired difference (or the slope).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from capsmed.errors import CapsmedError

ALPHA = 0.05
REPETITION_FIELDS = ("seed", "fold")
VERDICTS = ("holds", "fails", "undecided")
_KEYS = {"name", "quote", "source", "metric", "better", "than", "where", "scope", "kind",
         "along", "direction", "ignore", "evaluation", "file", "key"}


@dataclass(frozen=True)
class Claim:
    """One claim of a paper, stated over the runs of a study (see the module)."""

    name: str
    quote: str
    source: str
    metric: str
    field: str
    better: str
    than: tuple[str, ...]
    where: dict[str, tuple[str, ...]] = field(default_factory=dict)
    scope: str = "pooled"
    kind: str = "better"
    along: tuple[str, ...] = ()
    along_field: str = ""
    direction: str = "decreasing"
    ignore: tuple[str, ...] = ()  # fields left out of the pairing, besides ``field``
    evaluation: str = "report"  # the evaluation whose report.json holds ``metric``
    file: str = ""  # or: a JSON file in each run folder ...
    key: str = ""  # ... and the dotted path of the number in it (default: ``metric``)


@dataclass
class ClaimResult:
    """A claim's evidence and verdict."""

    claim: Claim
    verdict: str
    p_value: float | None  # one-sided, in the claimed direction, before correction
    p_adjusted: float | None
    effect: float | None  # mean paired difference (better - than), or the trend's slope
    pairs: int
    p_opposite: float | None = None
    p_opposite_adjusted: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        c = self.claim
        return {"name": c.name, "quote": c.quote, "source": c.source, "metric": c.metric,
                "statement": statement(c), "verdict": self.verdict,
                "p_value": self.p_value, "p_adjusted": self.p_adjusted,
                "effect": self.effect, "pairs": self.pairs, "note": self.note}


def statement(c: Claim) -> str:
    """The claim as capsmed tests it, in words."""
    than = " and ".join(c.than)
    where = "; ".join(f"{k} in {', '.join(v)}" for k, v in c.where.items())
    metric = (c.metric if c.evaluation == "report" and not c.file
              else f"{c.metric} ({c.file or c.evaluation})")
    if c.kind == "trend":
        return (f"{metric} gap {c.better} - {than} is {c.direction} along "
                f"{c.along_field} {', '.join(c.along)}" + (f" ({where})" if where else ""))
    scope = "in every cell" if c.scope == "every" else "over all pairs"
    return (f"{metric} of {c.field} {c.better} > {than} {scope}"
            + (f" ({where})" if where else ""))


def _values(raw: Any) -> tuple[str, ...]:
    items = raw if isinstance(raw, list | tuple) else [raw]
    return tuple(str(v) for v in items)


def _one_field(raw: Any, what: str, where: str) -> tuple[str, tuple[str, ...]]:
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise CapsmedError(f"{where}: {what} must be one field and its value(s), e.g. "
                           "{arch: capsnet}")
    (name, value), = raw.items()
    return str(name), _values(value)


def _check_applies(item: Mapping[str, Any], kind: str, scope: str, where: str) -> None:
    """Refuse options the claim would drop without a word, testing another claim than
    the one written (a per-cell trend tested pooled, a key read from report.json)."""
    ignored = ([k for k in ("along", "direction") if k in item] if kind == "better"
               else ["scope: every"] if scope == "every" else [])
    if ignored:
        raise CapsmedError(f"{where}: {', '.join(ignored)}: only for a "
                           f"{'trend' if kind == 'better' else 'better'} claim, this "
                           f"is kind: {kind}")
    if item.get("key") is not None and not item.get("file"):
        raise CapsmedError(f"{where}: key is a path in file:, which it lacks (without "
                           "file the number is metric of the evaluation's report.json)")
    if item.get("evaluation") is not None and item.get("file"):
        raise CapsmedError(f"{where}: evaluation names a report.json, but the number is "
                           "read from file:; give one of them")


def parse_claims(raw: Any, origin: str) -> list[Claim]:
    """The ``claims:`` section of a pipeline file, checked (unknown keys refused)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise CapsmedError(f"{origin}: claims must be a list")
    out, names = [], set()
    for i, item in enumerate(raw):
        where = f"{origin}: claims[{i}]"
        if not isinstance(item, Mapping):
            raise CapsmedError(f"{where}: must be a mapping")
        unknown = sorted(set(item) - _KEYS)
        missing = [k for k in ("name", "quote", "source", "metric", "better", "than")
                   if k not in item]
        if unknown or missing:
            raise CapsmedError(f"{where}: " + "; ".join(
                ([f"unknown key(s) {', '.join(unknown)}"] if unknown else [])
                + ([f"missing {', '.join(missing)}"] if missing else [])))
        better_field, better = _one_field(item["better"], "better", where)
        than_field, than = _one_field(item["than"], "than", where)
        if better_field != than_field or len(better) != 1:
            raise CapsmedError(f"{where}: better and than compare one value of one field "
                               f"with others of the same field")
        kind = str(item.get("kind", "better"))
        scope = str(item.get("scope", "pooled"))
        ignore = _values(item.get("ignore") or [])
        if kind not in ("better", "trend") or scope not in ("pooled", "every"):
            raise CapsmedError(f"{where}: kind must be better or trend, scope pooled or "
                               "every")
        _check_applies(item, kind, scope, where)
        along_field, along = ("", ())
        if kind == "trend":
            along_field, along = _one_field(item.get("along"), "along", where)
            if len(along) < 3:
                raise CapsmedError(f"{where}: a trend needs along with 3 or more values "
                                   "in order")
        direction = str(item.get("direction", "decreasing"))
        if direction not in ("decreasing", "increasing"):
            raise CapsmedError(f"{where}: direction must be decreasing or increasing")
        selection = item.get("where") or {}
        if not isinstance(selection, Mapping):
            raise CapsmedError(f"{where}: where must map fields to values")
        name = str(item["name"])
        if name in names:
            raise CapsmedError(f"{where}: claim name '{name}' is used twice")
        names.add(name)
        out.append(Claim(name=name, quote=str(item["quote"]), source=str(item["source"]),
                         metric=str(item["metric"]), field=better_field,
                         better=better[0], than=than,
                         where={str(k): _values(v) for k, v in selection.items()},
                         scope=scope, kind=kind, along=along, along_field=along_field,
                         direction=direction, ignore=ignore,
                         evaluation=str(item.get("evaluation", "report")),
                         file=str(item.get("file") or ""),
                         key=str(item.get("key") or item["metric"])))
    return out


Record = Mapping[str, Any]  # {"fields": {...}, "metrics": {...}}


def _pairs(claim: Claim, records: Sequence[Record], than: str
           ) -> dict[tuple, list[tuple[float, float]]]:
    """``{cell: [(better, than) per repetition]}``: runs matched on every field but the
    compared one, a cell being those fields without the repetition ones. A cell where
    only one side has runs is there with no pairs: ``scope: every`` cannot pass it by."""
    by_key: dict[tuple, dict[str, float]] = {}
    for r in records:
        fields = {k: str(v) for k, v in r["fields"].items()}
        if any(fields.get(k) not in v for k, v in claim.where.items()):
            continue
        value = (r.get("metrics") or {}).get(claim.metric)
        who = fields.get(claim.field)
        if value is None or who not in (claim.better, than):
            continue
        key = tuple(sorted((k, v) for k, v in fields.items()
                           if k != claim.field and k not in claim.ignore))
        by_key.setdefault(key, {})[who] = float(value)
    cells: dict[tuple, list[tuple[float, float]]] = {}
    for key, values in by_key.items():
        pairs = cells.setdefault(tuple((k, v) for k, v in key if k not in REPETITION_FIELDS),
                                 [])
        if claim.better in values and than in values:
            pairs.append((values[claim.better], values[than]))
    return cells


def _non_finite(claim: Claim, records: Sequence[Record]) -> int:
    """How many of the runs a claim speaks of have a NaN or infinite number: one NaN
    makes its test's p-value NaN, which no comparison calls significant either way and
    which would disorder the Holm correction of the study's other claims."""
    count = 0
    for r in records:
        fields = {k: str(v) for k, v in r["fields"].items()}
        value = (r.get("metrics") or {}).get(claim.metric)
        if value is not None and fields.get(claim.field) in (claim.better, *claim.than) \
                and all(fields.get(k) in v for k, v in claim.where.items()) \
                and not np.isfinite(float(value)):
            count += 1
    return count


def _one_sided(d: np.ndarray) -> tuple[float | None, float | None]:
    """One-sided paired t-test p-values (mean > 0, mean < 0); None below 2 pairs."""
    if d.size < 2:
        return None, None
    scale = float(np.abs(d).max())
    if scale <= 1e-12:  # no difference, up to rounding (a mean of reordered values)
        return 1.0, 1.0
    if np.ptp(d) <= 1e-9 * scale:  # no spread: the sign alone decides
        return (0.0, 1.0) if d[0] > 0 else (1.0, 0.0)
    t = stats.ttest_1samp(d, 0.0)
    half = float(t.pvalue) / 2
    return (half, 1 - half) if t.statistic > 0 else (1 - half, half)


def _better(claim: Claim, records: Sequence[Record]) -> tuple[float | None, float | None,
                                                              float | None, int]:
    ps, qs, diffs = [], [], []
    for than in claim.than:
        cells = _pairs(claim, records, than)
        groups = (list(cells.values()) if claim.scope == "every"
                  else [[p for pairs in cells.values() for p in pairs]])
        for pairs in groups:
            d = np.array([a - b for a, b in pairs], dtype=float)
            p, q = _one_sided(d)
            if p is None:  # a cell of "every" with fewer than 2 pairs, or no pairs
                return None, None, None, 0
            ps.append(p)
            qs.append(q)
            diffs += d.tolist()
    # intersection-union: the claim holds only if every comparison does (largest p);
    # it fails if any comparison goes the other way: the smallest opposite p, times the
    # number of comparisons (Bonferroni), else with 5 fractions x 2 ConvNets and no
    # difference at all one of the 10 goes "the other way" at 0.05 about 40 % of the time
    return max(ps), min(1.0, min(qs) * len(qs)), float(np.mean(diffs)), len(diffs)


def _trend(claim: Claim, records: Sequence[Record]) -> tuple[float | None, float | None,
                                                             float | None, int]:
    xs, gaps, spans = [], [], []
    for than in claim.than:
        positions = set()
        for cell, pairs in _pairs(claim, records, than).items():
            position = dict(cell).get(claim.along_field)
            if position in claim.along and pairs:
                positions.add(position)
                for a, b in pairs:
                    xs.append(claim.along.index(position))
                    gaps.append(a - b)
        spans.append(len(positions))
    # each than must span the trend itself: a gap to baseline at one end only (or none,
    # its runs unfinished) would decide a claim about both ConvNets on LeNet alone
    if min(spans) < 3 or len(gaps) < 4:
        return None, None, None, len(gaps)
    fit = stats.linregress(xs, gaps)
    if not np.isfinite(fit.pvalue):  # the same gap everywhere (p NaN): no slope at all
        return 1.0, 1.0, 0.0, len(gaps)
    half = float(fit.pvalue) / 2
    down = (half, 1 - half) if fit.slope < 0 else (1 - half, half)
    p, q = down if claim.direction == "decreasing" else down[::-1]
    return p, q, float(fit.slope), len(gaps)


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values (None stays None and is not counted)."""
    known = [(p, i) for i, p in enumerate(p_values) if p is not None]
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(known)):
        running = max(running, min(1.0, (len(known) - rank) * p))
        out[i] = running
    return out


def evaluate_claims(claims: Sequence[Claim], records: Sequence[Record]) -> list[ClaimResult]:
    """Each claim's verdict over ``records`` (the study's finished runs)."""
    return judge_claims(claims, [records] * len(claims))


def judge_claims(claims: Sequence[Claim], records: Sequence[Sequence[Record]]
                 ) -> list[ClaimResult]:
    """Each claim's verdict over its own records (``records[i]`` for ``claims[i]``: the
    numbers each claim reads may come from different reports or files), corrected
    together."""
    results = []
    for claim, own in zip(claims, records, strict=True):
        bad = _non_finite(claim, own)
        if bad:
            results.append(ClaimResult(claim, "undecided", None, None, None, 0, note=(
                f"{bad} of its runs have a NaN or infinite {claim.metric}: not tested")))
            continue
        test = _trend if claim.kind == "trend" else _better
        p, q, effect, pairs = test(claim, own)
        results.append(ClaimResult(claim, "undecided", p, None, effect, pairs, q))
    adjusted = holm([r.p_value for r in results])
    opposite = holm([r.p_opposite for r in results])
    for r, p_adj, q_adj in zip(results, adjusted, opposite, strict=True):
        r.p_adjusted, r.p_opposite_adjusted = p_adj, q_adj
        if r.p_value is None:
            r.note = r.note or (
                f"paired runs at fewer than 3 of its {r.claim.along_field} values for "
                "each of its than values (or fewer than 4 pairs) to decide"
                if r.claim.kind == "trend"
                else f"too few paired runs ({r.pairs}) to decide")
        elif p_adj is not None and p_adj < ALPHA:
            r.verdict = "holds"
        elif q_adj is not None and q_adj < ALPHA:
            r.verdict = "fails"
        else:
            r.note = "neither direction is significant at 0.05 after Holm's correction"
    return results


def claims_note(results: Sequence[ClaimResult]) -> str:
    """One summary line: how many claims hold, fail, are undecided."""
    counts = {v: sum(r.verdict == v for r in results) for v in VERDICTS}
    return (f"{counts['holds']} of {len(results)} claims hold, {counts['fails']} fail, "
            f"{counts['undecided']} undecided (one-sided paired t-tests, Holm-corrected, "
            f"alpha {ALPHA})")
