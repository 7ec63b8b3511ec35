"""``capsmed run [status] PIPELINE.yaml``: a whole study (pipelines/) in one command."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, parse_key_values
from capsmed.errors import CapsmedError

EPILOG = ("Examples: capsmed run pipelines/smoke.yaml | capsmed run --dry-run "
          "pipelines/jimenez2018.yaml --only arch=capsnet,dataset=mnist | capsmed run "
          "status pipelines/jimenez2018.yaml | capsmed run pipelines/vigueras2021.yaml "
          "--executor slurm --slurm-partition gpu --set data_root=/data")


@handles_errors(sigterm=False)  # SIGTERM kills the runner; its trainings then save
def run(
    args: list[str] = typer.Argument(..., metavar="[status] PIPELINE",
                                     help="A pipeline YAML (see pipelines/); 'status "
                                          "PIPELINE' prints where its runs stand."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the expanded runs, "
                                 "their status and an estimated time; run nothing."),
    only: list[str] = typer.Option(None, help="Keep runs with FIELD=VALUE[,FIELD=VALUE]; "
                                   "repeatable (e.g. arch=capsnet,dataset=mnist)."),
    exclude: list[str] = typer.Option(None, help="Drop the runs matching all of "
                                      "FIELD=VALUE[,FIELD=VALUE]; repeatable."),
    set_: list[str] = typer.Option(None, "--set", help="Override a pipeline variable: "
                                   "KEY=VALUE, repeatable (e.g. data_root=/data). The "
                                   "environment's CAPSMED_<KEY> also works."),
    retries: int = typer.Option(1, help="Attempts after a run's first failure."),
    executor: str = typer.Option(None, help="local or slurm [the pipeline's, else local]."),
    jobs: int = typer.Option(None, help="Runs at once with the local executor [one per "
                             "GPU; 1 on a CPU]."),
    gpus: str = typer.Option(None, help="GPUs for the local executor, e.g. 0,1 [all "
                             "visible]."),
    slurm_partition: str = typer.Option(None, help="Slurm partition [the pipeline's]."),
    slurm_time: int = typer.Option(None, help="Slurm time limit per run, minutes [the "
                                   "pipeline's, else 1440]."),
    slurm_account: str = typer.Option(None, help="Slurm account."),
    slurm_gpus: int = typer.Option(None, help="GPUs per Slurm job [the pipeline's, else 0]."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write the study's "
                                "tables at the end."),
) -> None:
    """Run a study: data stages once, then every training run of the grid (skipping
    finished ones, resuming interrupted ones), then its analyses and report tables."""
    from rich.console import Console

    from capsmed.pipeline.runner import RunOptions, ensure_path, run_pipeline
    from capsmed.pipeline.spec import load_pipeline

    if len(args) == 2 and args[0] == "status":
        mode, path = "status", args[1]
    elif len(args) == 1:
        mode, path = "run", args[0]
    else:
        raise CapsmedError("usage: capsmed run PIPELINE.yaml, or capsmed run status "
                           "PIPELINE.yaml")
    pipeline = load_pipeline(ensure_path(Path(path)), parse_key_values(set_, "--set"))
    if mode == "status" or dry_run:
        _print_table(pipeline, only or [], exclude or [], Console(), estimates=dry_run)
        return
    from capsmed.pipeline.resources import check_resources

    overrides = {k: v for k, v in {"partition": slurm_partition, "time_min": slurm_time,
                                   "account": slurm_account, "gpus": slurm_gpus}.items()
                 if v is not None}
    options = RunOptions(only=only or [], exclude=exclude or [], retries=retries,
                         executor=executor, jobs=jobs,
                         gpus=[g.strip() for g in gpus.split(",") if g.strip()]
                         if gpus is not None else None,
                         resources=check_resources(overrides, "--slurm-*", "command line"),
                         report=report)
    if retries < 0 or (jobs is not None and jobs < 1):
        raise CapsmedError("--retries must be >= 0 and --jobs >= 1")
    raise typer.Exit(run_pipeline(pipeline, options))


def _print_table(pipeline, only: list[str], exclude: list[str], console, estimates: bool
                 ) -> None:
    from capsmed.pipeline.display import status_table
    from capsmed.pipeline.estimate import (
        estimate_seconds,
        human,
        load_throughput,
        split_sizes_of,
    )
    from capsmed.pipeline.runner import (
        count_by_status,
        foreign_run_dirs,
        select_runs,
        status_rows,
    )
    from capsmed.pipeline.state import PipelineState

    runs = select_runs(pipeline, only, exclude)
    state = PipelineState(pipeline.out)
    rows = status_rows(pipeline, state, runs)
    fields = list(dict.fromkeys(k for r in runs for k in r.fields))
    per_run: dict[str, str] = {}
    total, source = 0.0, ""
    if estimates:
        import torch

        throughput = load_throughput(gpu=torch.cuda.is_available())
        for run in runs:
            seconds = estimate_seconds(run, throughput, split_sizes_of(run.train.get("data")))
            if seconds is not None:
                per_run[run.label] = human(seconds)
                total += seconds
        source = "GPU (H100 eager bf16)" if torch.cuda.is_available() else "this CPU kind"
    console.print(status_table(pipeline.name, rows, fields, per_run if estimates else None))
    counts = ", ".join(f"{n} {s}" for s, n in count_by_status(rows).items())
    console.print(f"{len(rows)} runs ({counts}); output: {pipeline.out}")
    foreign = foreign_run_dirs(pipeline, state)
    if foreign:
        echo_wrapped(f"{len(foreign)} folder(s) in {foreign[0].parent} belong to no run "
                     "of this pipeline now (their options, data or capsmed's protocol "
                     "revision changed) and are not counted, e.g. "
                     f"{foreign[0].name}; remove them when you no longer need them")
    if estimates:
        known = len(per_run)
        console.print(f"estimated training time: {human(total)} for the {known} runs with "
                      f"a measured throughput ({source}; one run at a time; an estimate)"
                      if known else "no estimate: the data is not made yet, or no "
                      "throughput was measured for these architectures")
