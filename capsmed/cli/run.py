"""``capsmed run [status|wait] PIPELINE``: a whole study (pipelines/) in one command;
PIPELINE is a YAML file or the name of a study capsmed carries (``smoke``)."""

from __future__ import annotations

import sys

import typer

from capsmed.bundled import bundled_pipelines
from capsmed.cli.common import handles_errors, parse_key_values
from capsmed.cli.json_output import JSON_HELP, print_json
from capsmed.errors import CapsmedError

EPILOG = ("Examples: capsmed run smoke | capsmed run --dry-run "
          "jimenez2018 --only arch=capsnet,dataset=mnist | capsmed run "
          "status jimenez2018 --json | capsmed run pipelines/vigueras2021.yaml "
          "--executor slurm --slurm-partition gpu --set data_root=/data --detach | "
          "capsmed run wait pipelines/vigueras2021.yaml")
MODES = ("status", "wait")
# a glob of a handful of files: the help names the studies this install carries
STUDIES = ", ".join(bundled_pipelines()) or "none"


@handles_errors  # SIGTERM as Ctrl-C: the trainings save, the lock goes, exit 130
def run(
    args: list[str] = typer.Argument(..., metavar="[status|wait] PIPELINE",
                                     help="A pipeline YAML file, or the name of a "
                                          f"study capsmed carries ({STUDIES}); a file "
                                          "of that name wins. 'status PIPELINE' prints "
                                          "where its runs stand; 'wait PIPELINE' "
                                          "follows its jobs to their end and writes "
                                          "the report."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check everything the run "
                                 "would refuse; print the runs by group, their status, "
                                 "resources and estimated time; run nothing."),
    list_all: bool = typer.Option(False, "--list", help="With status or --dry-run: every "
                                  "run on its own line, not only the groups."),
    only: list[str] = typer.Option(None, help="Keep runs with FIELD=VALUE[,FIELD=VALUE]; "
                                   "repeatable (e.g. arch=capsnet,dataset=mnist)."),
    exclude: list[str] = typer.Option(None, help="Drop the runs matching all of "
                                      "FIELD=VALUE[,FIELD=VALUE]; repeatable."),
    set_: list[str] = typer.Option(None, "--set", help="Override a pipeline variable: "
                                   "KEY=VALUE, repeatable (e.g. data_root=/data). The "
                                   "environment's CAPSMED_<KEY> also works."),
    retries: int = typer.Option(1, help="Attempts after a job's first failure (a job "
                                "requeued at a time limit or on preemption is not a "
                                "failure)."),
    executor: str = typer.Option(None, help="local or slurm [the pipeline's, else local]."),
    jobs: int = typer.Option(None, help="Jobs at once [local: one per GPU, 1 on a CPU]. "
                             "slurm: tasks at once of each job array, not in all "
                             "(several arrays run side by side) [256]."),
    gpus: str = typer.Option(None, help="GPUs of this machine for the local executor, "
                             "e.g. 0,1; '' for none (CPUs) [all visible]."),
    runs_per_gpu: int = typer.Option(None, "--runs-per-gpu", min=1, help="Local "
                                     "executor: runs sharing each GPU at once, for small "
                                     "runs that leave it idle between launches [1]."),
    allow_cpu: bool = typer.Option(False, "--allow-cpu", help="Train runs that ask for "
                                   "GPUs (resources.gpus) where there are none."),
    detach: bool = typer.Option(False, "--detach", help="Submit and return: Slurm jobs go "
                                "on alone; the local executor goes on in the background. "
                                "Follow with 'capsmed run status|wait PIPELINE'."),
    slurm_partition: str = typer.Option(None, help="resources.partition of every job."),
    slurm_time: int = typer.Option(None, help="resources.time_min of every job: its time "
                                   "limit in minutes [1440]."),
    slurm_account: str = typer.Option(None, help="resources.account of every job."),
    slurm_qos: str = typer.Option(None, help="resources.qos of every job."),
    slurm_constraint: str = typer.Option(None, help="resources.constraint of every job."),
    slurm_gpus: int = typer.Option(None, help="resources.gpus: GPUs per training run."),
    slurm_cpus: int = typer.Option(None, help="resources.cpus: CPUs per process."),
    slurm_mem: float = typer.Option(None, help="resources.mem_gb: memory per node, GB."),
    slurm_option: list[str] = typer.Option(None, help="A further sbatch option, "
                                           "NAME=VALUE (NAME=true for a flag); repeatable."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write the study's "
                                "tables at the end."),
    as_json: bool = typer.Option(False, "--json", help=f"With status: {JSON_HELP}"),
) -> None:
    """Run a study: data stages once, then every training run of the grid (skipping
    finished ones, resuming interrupted ones), then its analyses and report tables."""
    from capsmed.pipeline.runner import RunOptions, pipeline_file

    mode, path = _mode(args)
    if as_json and (mode != "status" or dry_run):
        raise CapsmedError("--json goes with 'capsmed run status PIPELINE'")
    from capsmed.pipeline.spec import load_pipeline

    pipeline = load_pipeline(pipeline_file(path), parse_key_values(set_, "--set"))
    overrides = {"partition": slurm_partition, "time_min": slurm_time,
                 "account": slurm_account, "qos": slurm_qos, "constraint": slurm_constraint,
                 "gpus": slurm_gpus, "cpus": slurm_cpus, "mem_gb": slurm_mem,
                 "sbatch": _sbatch_options(slurm_option)}
    options = RunOptions(only=only or [], exclude=exclude or [], retries=retries,
                         executor=executor, jobs=jobs, gpus=_gpus(gpus),
                         runs_per_gpu=runs_per_gpu, allow_cpu=allow_cpu,
                         detach=detach, report=report,
                         resources={k: v for k, v in overrides.items() if v is not None})
    if as_json:
        from capsmed.pipeline.overview import overview_record, study_overview

        print_json(overview_record(study_overview(pipeline, options, dry_run=False)))
        return
    _show_or_run(pipeline, options, mode, dry_run, list_all)


def _sbatch_options(pairs: list[str] | None) -> dict[str, object] | None:
    """``--slurm-option exclusive=true --slurm-option mail-type=END``."""
    out: dict[str, object] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise CapsmedError(f"--slurm-option expects NAME=VALUE, got '{pair}'")
        word = value.strip().lower()  # true: a flag; false: remove the pipeline's
        out[name.strip()] = True if word == "true" else False if word == "false" \
            else value.strip()
    return out or None


def _mode(args: list[str]) -> tuple[str, str]:
    if len(args) == 2 and args[0] in MODES:
        return args[0], args[1]
    if len(args) == 1:
        return "run", args[0]
    raise CapsmedError("usage: capsmed run PIPELINE.yaml, capsmed run status PIPELINE.yaml "
                       "or capsmed run wait PIPELINE.yaml")


def _gpus(text: str | None) -> list[str] | None:
    if text is None:
        return None
    devices = [g.strip() for g in text.split(",") if g.strip()]
    if not all(g.isdigit() for g in devices):
        raise CapsmedError(f"--gpus expects GPU numbers such as 0,1, got '{text}'")
    return devices


def _show_or_run(pipeline, options, mode: str, dry_run: bool, list_all: bool) -> None:
    from capsmed.pipeline import runner
    from capsmed.pipeline.preflight import MissingInputs

    try:
        if mode == "status" or dry_run:
            _show(pipeline, options, dry_run, list_all)
        elif mode == "wait":
            raise typer.Exit(runner.wait_pipeline(pipeline, options))
        elif options.detach and not runner.executor_for(pipeline, options).detached:
            runner.prepare(pipeline, options, _commands())
            argv = [a for a in sys.argv[1:] if a != "--detach"]
            typer.echo(runner.start_in_background(argv, pipeline))
        else:
            raise typer.Exit(runner.run_pipeline(pipeline, options, _commands()))
    except MissingInputs as exc:  # every missing input on its own line
        for line in exc.lines:
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(exc.exit_code) from None


def _show(pipeline, options, dry_run: bool, list_all: bool) -> None:
    from rich.console import Console

    from capsmed.pipeline import runner
    from capsmed.pipeline.display import print_claims, print_overview
    from capsmed.pipeline.overview import study_overview
    from capsmed.pipeline.preflight import MissingInputs

    missing = None
    if dry_run:
        try:
            runner.prepare(pipeline, options, _commands())
        except MissingInputs as exc:  # the plan is still worth seeing (sizes, estimates)
            missing = exc
        except CapsmedError:  # refused: what the study would test is still worth seeing
            print_claims(pipeline.claims, Console(highlight=False))
            raise
    print_overview(study_overview(pipeline, options, dry_run), Console(highlight=False),
                   list_all, dry_run)
    if missing is not None:
        raise missing


def _commands() -> set[tuple[str, ...]]:
    """The capsmed commands there are, as paths: ("preprocess", "tupac16"), ..."""
    from capsmed.cli import app

    def walk(command, prefix=()):
        subs = getattr(command, "commands", None)
        if not subs:
            yield prefix
            return
        for name, sub in subs.items():
            yield from walk(sub, (*prefix, name))

    return set(walk(typer.main.get_command(app)))
