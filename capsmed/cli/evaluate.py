"""``capsmed evaluate RUN_DIR``: the per-class report of a run's best checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set
from capsmed.cli.json_output import json_option, print_json_file
from capsmed.cli.options import device_option, option
from capsmed.train.config import TrainConfig


@handles_errors
def evaluate(
    run_dir: Path = typer.Argument(..., help="A run directory written by capsmed train."),
    split: str = typer.Option("test", help="Split of the dataset to evaluate on."),
    data: Path = typer.Option(None, help="Evaluate on another .h5 with the same classes."),
    device: str = device_option(),
    agreement: bool = typer.Option(False, "--agreement", help="Also compute paper 001's "
                                   "agreement (Agr): the share of images given the same "
                                   "class in all 8 orientations (4 rotations x flip), and "
                                   "the accuracy in each (8x the inference cost)."),
    grids: bool = typer.Option(True, "--grids/--no-grids", help="Reconstruction and capsule "
                               "perturbation grids for models with a decoder."),
    batch_size: int = option(TrainConfig, "eval_batch_size", "Images per forward pass"),
    report_name: str = typer.Option("report", help="Folder in RUN_DIR for the report; "
                                    "another name keeps an evaluation on other --data "
                                    "apart from the run's own (capsmed report reads "
                                    "'report')."),
    as_json: bool = json_option(),
) -> None:
    """Per-class precision, sensitivity, specificity, F1, AUC and support; Acc, balanced
    Acc, macro/weighted F1; confusion matrices and report.html in RUN_DIR/report/."""
    from rich.console import Console

    from capsmed.evaluate.evaluation import evaluate_run
    from capsmed.evaluate.run_report import rich_table

    result = evaluate_run(run_dir, split=split, data=data,
                          device="auto" if device is None else device, agreement=agreement,
                          grids=grids, report_name=report_name,
                          **only_set(batch_size=batch_size))
    if as_json:  # report.json, as written
        print_json_file(result.report_dir / "report.json")
        return
    console = Console()
    console.print(rich_table(result.report, result.title, result.agreement))
    if result.agreement is not None:
        accs = ", ".join(f"{k} {v:.3f}" for k, v in result.agreement.accuracy.items())
        console.print(f"accuracy by orientation: {accs}", highlight=False)
    echo_wrapped(f"report written to {result.report_dir}/ ({', '.join(result.files)})")
