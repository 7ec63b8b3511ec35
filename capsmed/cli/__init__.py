"""The ``capsmed`` command. Each sub-command lives in its own module and only forwards."""

from __future__ import annotations

import inspect
import logging
import re
from typing import Any

import typer

from capsmed import __version__
from capsmed.cli import (
    analyze,
    bench,
    data,
    demo,
    evaluate,
    export,
    fetch,
    models,
    predict,
    preprocess,
    report,
    run,
    runs,
    synth,
    train,
)
from capsmed.cli.common import setup_logging
from capsmed.cli.sources import register_all

app = typer.Typer(
    name="capsmed",
    help="Capsule networks vs ConvNets for medical image classification: "
         "preprocess raw datasets into HDF5, train, and report per-class metrics.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # Help texts give defaults in [brackets]; as rich markup they would vanish.
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"capsmed {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only warnings and errors; "
                               "no progress bars."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Set logging and progress for every command."""
    from capsmed.progress import set_progress_enabled

    setup_logging(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
    set_progress_enabled(not quiet)


# Registered in pipeline order, which is the order --help lists them in.
register_all()
app.add_typer(fetch.app, name="fetch")
app.add_typer(synth.app, name="synth")
app.add_typer(preprocess.app, name="preprocess")
app.add_typer(data.app, name="data")
app.command("models")(models.models)
app.command("train")(train.train)
app.command("evaluate")(evaluate.evaluate)
app.command("predict", epilog=predict.EPILOG)(predict.predict)
app.command("export", epilog=export.EPILOG)(export.export)
app.command("report")(report.report)
app.add_typer(analyze.app, name="analyze")
app.add_typer(runs.app, name="runs")
app.command("run", epilog=run.EPILOG)(run.run)
app.command("demo")(demo.demo)
app.add_typer(bench.app, name="bench")


def whole_summaries(command: Any) -> Any:
    """Give every sub-command its whole first sentence as the line ``--help`` lists it
    by. Click otherwise cuts a summary at the terminal's width with '...', which in 80
    columns cut most of capsmed's mid-word. A long summary now wraps instead."""
    for sub in getattr(command, "commands", {}).values():
        if sub.short_help is None and sub.help:
            paragraph = " ".join(inspect.cleandoc(sub.help).split("\n\n")[0].split())
            sentence = re.split(r"(?<=[a-z0-9)])\.\s+(?=[A-Z])", paragraph, maxsplit=1)[0]
            sub.short_help = sentence.rstrip(".")
        whole_summaries(sub)
    return command


def main() -> None:
    """Console-script entry point."""
    whole_summaries(typer.main.get_command(app))()
