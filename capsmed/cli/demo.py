"""``capsmed demo``: the whole pipeline on synthetic TUPAC16 data, in a few minutes."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, only_set


@handles_errors
def demo(
    workdir: Path = typer.Option(Path("demo_out"), help="Folder for the demo's data and "
                                 "runs (re-created on each demo run)."),
    seed: int = typer.Option(None, help="Seed for data, split and training [0]."),
    cases: int = typer.Option(None, help="Synthetic cases [14]."),
) -> None:
    """Synthesise TUPAC16 -> preprocess -> train capsnet and lenet -> per-class reports
    -> predictions on new images."""
    from rich.columns import Columns
    from rich.console import Console

    from capsmed.demo import DemoConfig, run_demo
    from capsmed.evaluate.run_report import rich_table

    evaluations = run_demo(DemoConfig(workdir=workdir, **only_set(seed=seed, cases=cases)))
    console = Console()
    console.print(Columns([rich_table(e.report, e.title) for _, e in evaluations]))
    for _, e in evaluations:
        echo_wrapped(f"{e.title}: report in {e.report_dir}/, curves in "
                     f"{e.report_dir.parent / 'curves.png'}")
    echo_wrapped(f"predictions on new images (CSV, heatmaps, QuPath GeoJSON) in "
                 f"{workdir / 'predictions'}/")
