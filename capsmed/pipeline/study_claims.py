"""A pipeline's ``claims:``: the paper's sentences, stated as comparisons over its runs.

The format is :mod:`capsmed.evaluate.claims`'. Here each claim is also checked against
the grid when the file is read: its fields and values, the metric its evaluation gives
(or its ``file``), the evaluation its runs have, and that its runs pair one way only
(two runs that differ only in an ``ignore``d field would stand for one pair). A
misspelt claim is then a one-line error naming the file and the claim, not an
*undecided* verdict hours later. After the runs, :func:`judge_study_claims` gives each
claim its verdict, Holm-corrected over the study's claims, for the study page.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from capsmed.evaluate.claims import (
    ALPHA,
    Claim,
    ClaimResult,
    claims_note,
    judge_claims,
    parse_claims,
    statement,
)
from capsmed.evaluate.significance import p_decimals
from capsmed.pipeline.checks import check_selection, known_metrics, matches_selection
from capsmed.pipeline.placeholders import fail
from capsmed.tables import Column, Table, text_column
from capsmed.tables.text import md_escape

NO_PAIR = "None"  # the text of a field a run's grid block lacks (grid_axes' value)


def read_claims(raw: Any, axes: Mapping[str, list[str]], runs: Sequence[Any],
                path: Path) -> list[Claim]:
    """The checked ``claims:`` section of a pipeline file (``[]`` without one)."""
    claims = parse_claims(raw, str(path))
    for i, claim in enumerate(claims):
        _check_claim(claim, axes, runs, f"claims[{i}] ({claim.name})", path)
    return claims


def _check_claim(claim: Claim, axes: Mapping[str, list[str]], runs: Sequence[Any],
                 where: str, path: Path) -> None:
    check_selection({claim.field: [claim.better, *claim.than]}, axes,
                    f"{where}: better/than", path)
    check_selection(dict(claim.where), axes, f"{where}.where", path)
    if claim.kind == "trend":
        check_selection({claim.along_field: list(claim.along)}, axes, f"{where}.along",
                        path)
    unknown = [f for f in claim.ignore if f not in axes]
    if unknown:
        raise fail(path, f"{where}.ignore: unknown grid field '{unknown[0]}' (the grid "
                   f"has: {', '.join(axes)})")
    chosen = [r for r in runs if matches_selection(dict(claim.where), r.fields)]
    for value in (claim.better, *claim.than):
        if not any(str(r.fields.get(claim.field)) == value for r in chosen):
            raise fail(path, f"{where}: no run of the grid has {claim.field} {value} "
                       "where the claim looks ('where')")
    if not claim.file:
        if claim.metric not in known_metrics():
            raise fail(path, f"{where}: unknown metric '{claim.metric}' (report.json "
                       f"gives: {', '.join(known_metrics())}; a number of another file: "
                       "file and key)")
        names = list(dict.fromkeys(e.name for r in chosen for e in r.evaluations))
        if claim.evaluation not in names:
            raise fail(path, f"{where}: evaluation '{claim.evaluation}' is not an "
                       f"evaluation of its runs ({', '.join(names)})")
    _check_pairing(claim, chosen, axes, where, path)


def _check_pairing(claim: Claim, chosen: Sequence[Any], axes: Mapping[str, list[str]],
                   where: str, path: Path) -> None:
    """Two runs of one compared value must not pair alike (one would hide the other)."""
    seen: dict[tuple, Any] = {}
    for run in chosen:
        fields = _all_fields(run.fields, axes)
        who = fields[claim.field]
        if who not in (claim.better, *claim.than):
            continue
        key = (who, *sorted((k, v) for k, v in fields.items()
                            if k != claim.field and k not in claim.ignore))
        other = seen.setdefault(key, run)
        if other is not run:
            raise fail(path, f"{where}: runs {other.label} and {run.label} would be one "
                       "pair member (they differ only in an ignored field); narrow "
                       "'where' to one of them")


def _all_fields(fields: Mapping[str, Any], axes: Mapping[str, list[str]]) -> dict[str, str]:
    """Every grid field of a run as text, ``None`` where its grid block lacks one."""
    return {k: str(fields.get(k)) if k in fields else NO_PAIR for k in axes}


def claim_source(claim: Claim) -> dict[str, Any]:
    """Where a claim's numbers come from, as a study table spec says it."""
    spec: dict[str, Any] = {"metric": claim.metric, "evaluation": claim.evaluation}
    if claim.file:
        spec.update(file=claim.file, key=claim.key)
    return spec


def judge_study_claims(claims: Sequence[Claim], runs: Sequence[Any],
                       values: Callable[[Claim, list[Any]], Sequence[tuple[Any, float]]]
                       ) -> list[ClaimResult]:
    """Each claim's verdict over the finished runs it speaks of; ``values(claim, runs)``
    gives ``(run, number)`` for those finished (:func:`capsmed.pipeline.study.
    table_values` over :func:`claim_source`)."""
    axes = list(dict.fromkeys(k for r in runs for k in r.fields))
    records = []
    for claim in claims:
        chosen = [r for r in runs if matches_selection(dict(claim.where), r.fields)
                  and str(r.fields.get(claim.field)) in (claim.better, *claim.than)]
        records.append([{"fields": _all_fields(run.fields, dict.fromkeys(axes)),
                         "metrics": {claim.metric: value}}
                        for run, value in values(claim, chosen)])
    return judge_claims(claims, records)


def _number(value: float | None, digits: int = 3) -> str:
    """A p-value in ``digits`` decimals, more where they would round it across the
    claims' alpha (0.0496 shown 0.050 beside "holds")."""
    if value is None:
        return "-"
    return "< 0.001" if 0 <= value < 0.001 else p_decimals(value, ALPHA, digits)


def _p(value: float | None) -> str:
    number = _number(value)
    return "p -" if value is None else f"p {number}" if number[0] == "<" else f"p = {number}"


def _effect(result: ClaimResult) -> str:
    if result.effect is None:
        return "-"
    return f"{result.effect:+.4f}" + ("/step" if result.claim.kind == "trend" else "")


def claims_table(results: Sequence[ClaimResult]) -> Table:
    """One row per claim: its verdict, effect, Holm-corrected p-value and pairs."""
    table = Table("Claims",
                  [text_column("claim"), Column("verdict", align="left"),
                   Column("effect"), Column("p (Holm)", short="p"),
                   Column("pairs", priority=1)], [])
    for r in results:
        table.rows.append([r.claim.name, r.verdict, _effect(r), _number(r.p_adjusted),
                           str(r.pairs)])
    table.notes.append(claims_note(results) + ", each claim as the paper states it "
                       "below. Effect: the mean paired difference "
                       "better - than (a trend: the slope of the gap per step along "
                       "its values); p: one-sided, in the claimed direction.")
    return table


def claim_paragraphs(results: Sequence[ClaimResult]) -> list[tuple[str, str, str]]:
    """``(heading, quote, what was tested and found)`` per claim."""
    out = []
    for r in results:
        found = (f"{r.verdict}: {r.pairs} pairs, {r.note}" if r.p_value is None else
                 f"{r.verdict}: effect {_effect(r)}, {_p(r.p_adjusted)} (Holm-"
                 f"corrected; {_p(r.p_value)} alone), {r.pairs} pairs"
                 + (f"; {r.note}" if r.note else ""))
        out.append((f"{r.claim.name} ({r.claim.source})", r.claim.quote,
                    f"Tested: {statement(r.claim)}. {found[0].upper()}{found[1:]}."))
    return out


def claims_markdown(results: Sequence[ClaimResult]) -> str:
    """The claims' quotes and verdicts, under the table, for study.md: names, quotes
    and run values as written (a claim named ``<b>`` or ``*x*`` is no tag, no italic)."""
    parts = []
    for heading, quote, found in claim_paragraphs(results):
        heading, quote, found = md_escape(heading), md_escape(quote), md_escape(found)
        parts.append(f"**{heading}**\n\n> {quote}\n\n{found}\n")
    return "\n".join(parts)


def claims_html(results: Sequence[ClaimResult]) -> str:
    from capsmed.tables.html import esc

    return "".join(f'<div class="claim"><h3>{esc(heading)}</h3><blockquote>'
                   f"{esc(quote)}</blockquote><p>{esc(found)}</p></div>"
                   for heading, quote, found in claim_paragraphs(results))


def claim_lines(claims: Sequence[Claim], width: int = 80) -> list[str]:
    """What ``capsmed run --dry-run`` lists: each claim, its source and the test."""
    if not claims:
        return []
    lines = textwrap.wrap(f"{len(claims)} claim(s) to test (one-sided paired t-tests "
                          "over the repetitions, Holm-corrected):", width)
    for claim in claims:
        lines += textwrap.wrap(f"{claim.name} ({claim.source}): {statement(claim)}",
                               width, initial_indent="  ", subsequent_indent="      ",
                               break_on_hyphens=False)
    return lines
