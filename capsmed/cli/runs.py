"""``capsmed runs``: list training runs."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import handles_errors

app = typer.Typer(help="List and inspect training runs.", no_args_is_help=True)


@app.command("ls")
@handles_errors
def ls(root: Path = typer.Argument(Path("runs"), help="Folder to search for runs.")) -> None:
    """Runs below ROOT: architecture, dataset, protocol, best epoch, validation metrics."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from capsmed.errors import CapsmedError
    from capsmed.runs.index import find_runs

    if not root.is_dir():
        raise CapsmedError(f"{root}: no such folder")
    runs = find_runs(root)
    if not runs:
        typer.echo(f"no runs under {root} (train one with: capsmed train ...)")
        return
    # light rules, no outer edge: 80 columns hold the numbers and wide enough labels
    table = Table(title=escape(f"Runs under {root}"), box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, padding=(0, 1), collapse_padding=True)
    table.caption = ("ep: epochs run (2/10: unfinished; capsmed train --resume "
                     "continues it); best: kept epoch; loss/acc: validation at the kept "
                     "epoch; rep: evaluated (stale: the run trained on after it)")
    arch = max(len(r.arch) for r in runs)
    for column, width, most in (("run", 12, 16), ("arch", arch, arch), ("data", 7, 9),
                                ("protocol", 10, 12)):
        table.add_column(column, overflow="fold", min_width=width, max_width=most)
    for column in ("ep", "best", "loss", "acc", "rep"):
        table.add_column(column, no_wrap=True, justify="right")
    for r in runs:
        table.add_row(escape(str(r.path.relative_to(root)) or "."), r.arch, escape(r.dataset),
                      escape(r.protocol),
                      str(r.epochs_run) + (f"/{r.epochs_planned}" if r.epochs_planned
                                           else ""),
                      str(r.best_epoch or "-"),
                      f"{r.val_loss:.4f}" if r.val_loss is not None else "-",
                      f"{r.val_acc:.3f}" if r.val_acc is not None else "-",
                      "stale" if r.report_stale else "yes" if r.evaluated else "no")
    Console().print(table)
