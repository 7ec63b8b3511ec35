"""``capsmed evaluate RUN_DIR``: the per-class report of a run's best checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import handles_errors


@handles_errors
def evaluate(
    run_dir: Path = typer.Argument(..., help="A run directory written by capsmed train."),
    split: str = typer.Option("test", help="Split of the dataset to evaluate on."),
    data: Path = typer.Option(None, help="Evaluate on another .h5 with the same classes."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, mps."),
) -> None:
    """Per-class precision, sensitivity, specificity, F1 and support; Acc; balanced Acc."""
    from rich.console import Console

    from capsmed.evaluate.report import rich_table
    from capsmed.evaluate.run import evaluate_run

    result = evaluate_run(run_dir, split=split, data=data, device=device)
    Console().print(rich_table(result.report, result.title))
    typer.echo(f"report written to {result.report_dir}/ (report.json, report.csv, report.md, "
               "confusion_matrix.png)")
