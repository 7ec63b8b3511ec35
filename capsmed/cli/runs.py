"""``capsmed runs``: list training runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import typer

from capsmed.cli.common import handles_errors
from capsmed.cli.json_output import json_option, print_json

app = typer.Typer(help="List and inspect training runs.", no_args_is_help=True)


@app.command("ls")
@handles_errors
def ls(root: Path = typer.Argument(Path("runs"), help="Folder to search for runs."),
       as_json: bool = json_option()) -> None:
    """Runs below ROOT: architecture, dataset, protocol, best epoch, validation metrics."""
    from capsmed.errors import CapsmedError
    from capsmed.runs.index import find_runs
    from capsmed.tables.terminal import print_tables

    if not root.is_dir():
        raise CapsmedError(f"{root}: no such folder")
    runs = find_runs(root)
    if as_json:  # a list, empty when there are no runs
        print_json([_run_record(r, root) for r in runs])
        return
    if not runs:
        typer.echo(f"no runs under {root} (train one with: capsmed train ...)")
        return
    print_tables([_runs_table(runs, root)])


def _run_record(run: Any, root: Path) -> dict[str, Any]:
    """A run as ``--json`` lists it: the table's values, unformatted."""
    return {"run": str(run.path.relative_to(root)) or ".", **dataclasses.asdict(run),
            "report_stale": run.report_stale}


def _runs_table(runs: list, root: Path):
    """One row per run; in 80 columns the dataset, then the protocol, then the kept
    epoch and loss are left out before a run's name is shortened below 30 characters."""
    from capsmed.tables import Column, Table, text_column

    rows = [[str(r.path.relative_to(root)) or ".", r.arch, r.dataset, r.protocol,
             str(r.epochs_run) + (f"/{r.epochs_planned}" if r.epochs_planned else ""),
             str(r.best_epoch or "-"),
             f"{r.val_loss:.4f}" if r.val_loss is not None else "-",
             f"{r.val_acc:.3f}" if r.val_acc is not None else "-",
             "stale" if r.report_stale else "yes" if r.evaluated else "no"] for r in runs]
    columns = [text_column("run"), text_column("arch"), text_column("data", priority=3),
               text_column("protocol", priority=2), Column("ep"),
               Column("best", priority=1), Column("loss", priority=1), Column("acc"),
               Column("rep")]
    return Table(f"Runs under {root}", columns, rows, notes=[
        "ep: epochs run (2/10: unfinished; capsmed train --resume continues it while "
        "its resume.pt is there); best: "
        "kept epoch; loss/acc: validation at the kept epoch; rep: evaluated (stale: the "
        "run trained on after it)"])
