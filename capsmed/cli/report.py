"""``capsmed report RUNS... -o DIR``: mean +- std, paired tests and paper tables."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set
from capsmed.cli.json_output import json_option, print_json_file
from capsmed.cli.options import OUTPUT_FLAGS


@handles_errors
def report(
    runs: list[Path] = typer.Argument(..., help="Evaluated run directories, or folders "
                                      "searched recursively for them."),
    out: Path = typer.Option(..., *OUTPUT_FLAGS, help="Output folder (new, empty, or an "
                             "earlier report, which is replaced)."),
    metric: str = typer.Option(None, help="Metric of the paper-000 table, the tests and "
                               "the fraction plot: macro_f1, accuracy, balanced_accuracy, "
                               "weighted_f1, auc, agreement, macro_precision, ... "
                               "Default: macro_f1."),
    test: str = typer.Option(None, help="Paired test between architectures: ttest or "
                             "wilcoxon (needs 6+ pairs to reach p < 0.05). Default: ttest."),
    alpha: float = typer.Option(None, help="Significance level flagged in the tests. "
                                "Default: 0.05."),
    arch: list[str] = typer.Option(None, help="Architecture to include, repeatable; the "
                                   "order given is the column order. Default: all, "
                                   "alphabetical."),
    per_class: str = typer.Option(None, help="Per-class table to print: pooled (summed "
                                  "confusion matrices, paper 001) or mean (mean +- std "
                                  "over runs); both are written. Default: pooled."),
    digits: int = typer.Option(None, help="Decimals in the tables. Default: 3."),
    as_json: bool = json_option(),
) -> None:
    """Aggregate evaluated runs: tables in the papers' layouts, tests, plots, summary.json."""
    from capsmed.evaluate.aggregate_report import ReportConfig, report_runs
    from capsmed.tables.terminal import print_tables

    config = ReportConfig(**only_set(metric=metric, test=test, alpha=alpha,
                                     archs=tuple(arch) if arch else None,
                                     per_class=per_class, digits=digits))
    result = report_runs(runs, out, config)
    if as_json:  # OUT/summary.json, as written
        print_json_file(result.out_dir / "summary.json")
        return
    print_tables(result.printed)
    skipped = f", {len(result.skipped)} skipped" if result.skipped else ""
    echo_wrapped(f"{result.runs} run(s) in {result.groups} group(s){skipped}; report written "
               f"to {result.out_dir}/ ({', '.join(result.files)})")
