"""``capsmed bench``: throughput benchmarks (the figures in benchmarks/README.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, parse_key_values
from capsmed.cli.json_output import json_option, print_json
from capsmed.cli.options import device_option, option
from capsmed.io import user_data_dir
from capsmed.train.config import TrainConfig


def _shown(path: Path) -> str:
    """``path`` with the home folder as ``~``, as help texts show it."""
    try:
        return str(Path("~") / path.relative_to(Path.home()))
    except ValueError:
        return str(path)


# Results go to the user's data folder unless --results says otherwise: the current
# folder's benchmarks/results/train.jsonl was a tracked file when run in a checkout.
DEFAULT_RESULTS = user_data_dir() / "bench" / "train.jsonl"
RESULTS_HELP = ("JSON-lines file the results are appended to [the user's data folder: "
                f"{_shown(DEFAULT_RESULTS)}].")

app = typer.Typer(help="Measure training and evaluation throughput.", no_args_is_help=True)


def _check_results_file(path: Path) -> None:
    """Refuse an existing ``--results`` that is not a JSON-lines file (a dataset .h5 or
    a CSV given by mistake got a JSON line appended to it) before measuring anything.
    Its first line must open a JSON object; it may be cut short (a killed writer)."""
    from capsmed.errors import CapsmedError

    if not path.is_file():
        return  # created on the first result; a folder: append_line says why not
    with path.open("rb") as fh:
        head = fh.read(64).lstrip()
    if head and not head.startswith(b"{"):
        raise CapsmedError(f"{path}: not a JSON-lines results file (its first line is not "
                           "a JSON object); choose another --results")


@app.command("train")
@handles_errors
def train(
    arch: list[str] = typer.Option(..., help="Architecture(s) to measure; repeatable."),
    batch_size: int = option(TrainConfig, "batch_size", "Batch size"),
    device: str = device_option(),
    steps: int = typer.Option(20, help="Timed steps (after the warm-up)."),
    warmup: int = typer.Option(5, help="Untimed warm-up steps."),
    precision: str = typer.Option("auto", help="auto, fp32 (IEEE, TF32 off), tf32 (CUDA), "
                                  "bf16 or fp16."),
    channels_last: bool = typer.Option(None, "--channels-last/--no-channels-last",
                                       help="Channels-last memory format [on CUDA]."),
    compile_model: bool = typer.Option(False, "--compile/--no-compile",
                                       help="torch.compile the model first."),
    cuda_graph: bool = typer.Option(False, "--cuda-graph/--no-cuda-graph",
                                    help="Capture the whole training step (forward, "
                                         "backward, Adam) as one CUDA graph."),
    input_size: int = typer.Option(None, help="Input side [the paper's for the arch]."),
    channels: int = typer.Option(None, help="Input channels [the paper's]."),
    num_classes: int = typer.Option(None, help="Classes [the paper's]."),
    model_arg: list[str] = typer.Option(None, help="Architecture option key=value."),
    results: Path = typer.Option(None, help=RESULTS_HELP),
    as_json: bool = json_option(),
) -> None:
    """Training and evaluation images/s, step time and peak memory per architecture."""
    from capsmed.tables import Column, Table, text_column
    from capsmed.tables.terminal import print_tables
    from capsmed.train.bench import append_result, bench_train, gpu_peak

    batch_size = TrainConfig.batch_size if batch_size is None else batch_size
    device = TrainConfig.device if device is None else device
    table = Table(f"capsmed bench train (batch {batch_size}, {steps} timed steps)",
                  [text_column("arch"), text_column("input"), text_column("precision"),
                   *map(Column, ("train img/s", "step ms", "eval img/s", "peak MiB"))], [])
    kwargs = parse_key_values(model_arg, "--model-arg")
    results = results or DEFAULT_RESULTS
    _check_results_file(results)
    measured = []
    for name in arch:
        r = bench_train(name, batch_size=batch_size, device=device, steps=steps,
                        warmup=warmup, precision=precision, channels_last=channels_last,
                        compile_model=compile_model, cuda_graph=cuda_graph,
                        input_size=input_size,
                        channels=channels, num_classes=num_classes, model_kwargs=kwargs)
        if measured and not gpu_peak(r):  # the process's peak so far: an earlier
            # architecture's, not this one's (freed memory stays in the process)
            r = dataclasses.replace(r, peak_memory_mib=None)
        append_result(r, results)
        measured.append(r)
        table.notes = [f"device: {r.device}; float32 = IEEE fp32 (TF32 off); peak: " + (
            "GPU memory allocated" if gpu_peak(r) else
            "process RSS, the first --arch's only (one --arch per command gives "
            "each its own)")]
        table.rows.append([r.arch, r.input.replace(", ", "/").replace(" classes", ""),
                           r.precision, f"{r.train_images_per_s:,.0f}",
                           f"{r.train_step_ms:.1f}", f"{r.eval_images_per_s:,.0f}",
                           "-" if r.peak_memory_mib is None else
                           f"{r.peak_memory_mib:,.0f}"])
    if as_json:  # the results as appended to the file (without the host name)
        print_json([dataclasses.asdict(r) for r in measured])
        typer.echo(f"appended to {results}", err=True)
    else:
        print_tables([table])
        echo_wrapped(f"appended to {results}")
