"""``capsmed bench``: throughput benchmarks (the figures in benchmarks/README.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import handles_errors, parse_key_values
from capsmed.io import user_data_dir


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


@app.command("train")
@handles_errors
def train(
    arch: list[str] = typer.Option(..., help="Architecture(s) to measure; repeatable."),
    batch_size: int = typer.Option(128, help="Batch size."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:1, mps."),
    steps: int = typer.Option(20, help="Timed steps (after the warm-up)."),
    warmup: int = typer.Option(5, help="Untimed warm-up steps."),
    precision: str = typer.Option("auto", help="auto, fp32, bf16 or fp16."),
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
) -> None:
    """Training and evaluation images/s, step time and peak memory per architecture."""
    from capsmed.tables import Column, Table, text_column
    from capsmed.tables.terminal import print_tables
    from capsmed.train.bench import append_result, bench_train

    table = Table(f"capsmed bench train (batch {batch_size}, {steps} timed steps)",
                  [text_column("arch"), text_column("input"), text_column("precision"),
                   *map(Column, ("train img/s", "step ms", "eval img/s", "peak MiB"))], [])
    kwargs = parse_key_values(model_arg, "--model-arg")
    results = results or DEFAULT_RESULTS
    for name in arch:
        r = bench_train(name, batch_size=batch_size, device=device, steps=steps,
                        warmup=warmup, precision=precision, channels_last=channels_last,
                        compile_model=compile_model, cuda_graph=cuda_graph,
                        input_size=input_size,
                        channels=channels, num_classes=num_classes, model_kwargs=kwargs)
        append_result(r, results)
        table.notes = [f"device: {r.device}; peak: " + (
            "GPU memory allocated" if "cpu" not in r.device else
            "process RSS so far (one --arch per command for per-model figures)")]
        table.rows.append([r.arch, r.input.replace(", ", "/").replace(" classes", ""),
                           r.precision, f"{r.train_images_per_s:,.0f}",
                           f"{r.train_step_ms:.1f}", f"{r.eval_images_per_s:,.0f}",
                           f"{r.peak_memory_mib:,.0f}"])
    print_tables([table])
    typer.echo(f"appended to {results}")
