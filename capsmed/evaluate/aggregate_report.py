"""``capsmed report``: evaluated runs -> tables, tests, plots and ``summary.json``.

Everything is written into a staging folder beside the output folder and swapped in at
the end, so the output folder always holds one complete report: the previous one until
the new one is finished.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from capsmed import __version__
from capsmed.errors import CapsmedError
from capsmed.evaluate.aggregate import (
    Collection,
    Group,
    SkippedRun,
    collect_runs,
    group_runs,
    group_warnings,
    order_metrics,
)
from capsmed.evaluate.fraction_plot import (
    family_filename,
    fraction_families,
    plot_fraction_family,
)
from capsmed.evaluate.layouts import (
    groups_table,
    metric_table,
    metric_title,
    per_class_tables,
    significance_table,
)
from capsmed.evaluate.per_class import mean_per_class, pooled_per_class
from capsmed.evaluate.significance import FEW_PAIRS, TESTS, paired_tests
from capsmed.io import ensure_writable_dir, write_text_atomic
from capsmed.tables import Table, render

log = logging.getLogger(__name__)

REPORT_KIND = "capsmed report"


@dataclass(frozen=True)
class ReportConfig:
    """Options of ``capsmed report``.

    Attributes:
        metric: Overall metric of the paper-000 table, the tests and the fraction plot
            (paper 000 reports F1; for several classes that is the macro F1).
        test: ``ttest`` (paired t-test) or ``wilcoxon`` (signed-rank).
        alpha: Significance level for flagging p-values.
        archs: Architectures to include, in column order; empty = all, alphabetical.
        per_class: Which paper-001 table to print, ``pooled`` or ``mean`` (both are
            written).
        digits: Decimals in the formatted tables.
    """

    metric: str = "macro_f1"
    test: str = "ttest"
    alpha: float = 0.05
    archs: tuple[str, ...] = ()
    per_class: str = "pooled"
    digits: int = 3

    def __post_init__(self) -> None:
        if self.test not in TESTS:
            raise CapsmedError(f"--test must be one of {', '.join(TESTS)}, got '{self.test}'")
        if not 0.0 < self.alpha < 1.0:
            raise CapsmedError(f"--alpha must be within (0, 1), got {self.alpha}")
        if self.per_class not in ("pooled", "mean"):
            raise CapsmedError(f"--per-class must be pooled or mean, got '{self.per_class}'")
        if not 1 <= self.digits <= 6:
            raise CapsmedError(f"--digits must be within 1..6, got {self.digits}")


@dataclass(frozen=True)
class AggregateReport:
    """What ``report_runs`` wrote, and the tables worth printing."""

    out_dir: Path
    runs: int
    groups: int
    skipped: list[SkippedRun]
    printed: list[Table]
    files: list[str]
    notes: list[str] = field(default_factory=list)


@contextlib.contextmanager
def staged_report_dir(final: Path) -> Iterator[Path]:
    """Yield a staging folder; on success it replaces ``final`` in one rename.

    ``final`` may be missing, empty or an earlier capsmed report; anything else is
    refused, so a typo in ``-o`` never deletes a user's folder.
    """
    final = Path(final)
    check_output_dir(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
        os.replace(final, old / "report")
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_output_dir(final: Path) -> None:
    """Refuse an output folder that is a file or holds something other than a report:
    replacing an earlier report replaces the whole folder, so a run or a note kept in
    it would be deleted with it."""
    if final.exists():
        if not final.is_dir():
            raise CapsmedError(f"{final}: exists and is not a folder; choose another -o")
        written = _report_files(final)
        if written is None and any(final.iterdir()):
            raise CapsmedError(f"{final}: exists, is not empty and holds no capsmed report "
                               "(summary.json); choose another -o")
        foreign = sorted(p.name for p in final.iterdir() if p.name not in (written or ()))
        if foreign:
            them = "it" if len(foreign) == 1 else "them"
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise CapsmedError(f"{final}: holds {shown}, not written by its capsmed report; "
                               f"replacing the report would delete {them}: choose another "
                               f"-o or move {them} out")
    ensure_writable_dir(final.parent)


def _report_files(path: Path) -> set[str] | None:
    """The files the capsmed report in ``path`` wrote (its summary.json's list); None
    when ``path`` holds no capsmed report."""
    try:
        summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("kind") != REPORT_KIND:
        return None
    files = summary.get("files")
    return {"summary.json", *(map(str, files) if isinstance(files, list) else ())}


TABLE_FILES = ("md", "csv", "tex")  # capsmed.tables renderers, one file each


def _write_table_files(out: Path, stem: str, tables: Sequence[Table],
                       heading: str) -> list[str]:
    for suffix in TABLE_FILES:
        write_text_atomic(out / f"{stem}.{suffix}", render(suffix, tables, heading))
    return [f"{stem}.{suffix}" for suffix in TABLE_FILES]


def _group_summary(g: Group) -> dict[str, Any]:
    mean = mean_per_class(g.runs)
    return {"dataset": g.dataset, "arch": g.arch, "protocol": g.protocol,
            "settings": g.settings, "runs": [str(r.path) for r in g.runs],
            "repetitions": [r.repetition_label for r in g.runs],
            "metrics": {m: g.stat(m).to_dict() for m in g.metric_names()},
            "per_class_mean": {n: {k: s and s.to_dict() for k, s in v.items()}
                               for n, v in mean["per_class"].items()},
            "total_mean": {k: s and s.to_dict() for k, s in mean["total"].items()},
            "per_class_pooled": pooled_per_class(g.runs)}


def report_runs(paths: Sequence[Path], out_dir: Path,
                config: ReportConfig | None = None,
                collection: Collection | None = None) -> AggregateReport:
    """Aggregate the evaluated runs under ``paths`` into ``out_dir``.

    Writes the paper-000 metric table, the paper-001 per-class tables (pooled and
    mean), the paired tests (Markdown, CSV, LaTeX each), every group's statistics,
    metric-vs-fraction PNGs and ``summary.json`` holding all of it. ``collection``:
    the runs of ``paths`` already read (a pipeline's study index), else read here.
    """
    config = config or ReportConfig()
    check_output_dir(Path(out_dir))  # before any work: a bad -o fails at once
    collection = collection if collection is not None else collect_runs(paths)
    if not collection.runs:
        raise CapsmedError(f"{', '.join(map(str, paths))}: no evaluated runs "
                           f"({len(collection.skipped)} skipped); run capsmed evaluate "
                           "RUN_DIR first")
    missing = [a for a in config.archs if a not in {r.arch for r in collection.runs}]
    if missing:
        raise CapsmedError(f"--arch {', '.join(missing)}: no evaluated run of that "
                           "architecture")
    groups = group_runs(collection.runs, config.archs)
    available = order_metrics({m for g in groups for m in g.metric_names()})
    if config.metric not in available:
        raise CapsmedError(f"--metric {config.metric}: not in the reports; choose one of "
                           f"{', '.join(available)}")
    notes = group_warnings(groups)
    for note in notes:
        log.warning(note)
    tests, test_notes = paired_tests(groups, config.metric, config.test, config.alpha)
    # fewer than 6 pairs, or of non-zero differences (the test drops the others)
    few = [t for t in tests if config.test == "wilcoxon" and t.p_value is not None
           and FEW_PAIRS in t.note]
    if few:
        log.warning("Wilcoxon signed-rank: %d comparison(s) have fewer than 6 pairs that "
                    "differ and %s; add seeds or folds, or use --test ttest", len(few),
                    FEW_PAIRS)
    for note in test_notes:
        log.info(note)

    title = metric_title(config.metric)
    main = metric_table(groups, config.metric, config.digits, config.archs)
    per_class = {mode: per_class_tables(groups, mode, config.digits)
                 for mode in ("pooled", "mean")}
    significance = significance_table(tests, test_notes, config.test, config.alpha,
                                      config.digits)
    families = fraction_families(groups, config.metric)
    files: list[str] = []
    with staged_report_dir(out_dir) as tmp:
        files += _write_table_files(tmp, f"table_{config.metric}", [main], title)
        for mode, tables in per_class.items():
            files += _write_table_files(tmp, f"per_class_{mode}", tables,
                                        f"Per-class precision and sensitivity ({mode})")
        if significance is not None:
            files += _write_table_files(tmp, f"significance_{config.metric}",
                                        [significance], f"Paired tests on {title}")
        files += _write_table_files(tmp, "groups", [groups_table(groups, config.digits)],
                                    "Every group")
        plots = []
        for family in families:
            name = family_filename(family, config.metric)
            plot_fraction_family(family, config.metric, title, tmp / name)
            files.append(name)
            plots.append({"file": name, "other_settings": family.base,
                          "curves": {d: {a: [{"fraction": f, **s.to_dict()} for f, s in pts]
                                         for a, pts in archs.items()}
                                     for d, archs in family.curves.items()}})
        summary = {
            "kind": REPORT_KIND, "capsmed_version": __version__,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "inputs": [str(p) for p in paths], "options": asdict(config),
            "metrics_available": available,
            "runs": [r.to_dict() for g in groups for r in g.runs],
            "skipped": [{"path": str(s.path), "reason": s.reason}
                        for s in collection.skipped],
            "groups": [_group_summary(g) for g in groups],
            "significance": {"test": config.test, "alpha": config.alpha,
                             "metric": config.metric,
                             "tests": [t.to_dict() for t in tests], "notes": test_notes},
            "fraction_plots": plots, "notes": notes, "files": [*files, "summary.json"]}
        write_text_atomic(tmp / "summary.json", json.dumps(summary, indent=2))
    printed = [main, *per_class[config.per_class]]
    if significance is not None:
        printed.append(significance)
    return AggregateReport(out_dir=Path(out_dir), runs=sum(len(g.runs) for g in groups),
                           groups=len(groups), skipped=collection.skipped, printed=printed,
                           files=[*files, "summary.json"], notes=notes)
