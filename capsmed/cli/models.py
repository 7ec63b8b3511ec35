"""``capsmed models``: registered architectures and their parameter counts."""

from __future__ import annotations

import typer

from capsmed.cli.common import handles_errors

# Set by the trainer from the dataset, so not listed as options.
UNIFORM_ARGUMENTS = {"in_channels", "num_classes", "input_size", "input_mean", "input_std"}


@handles_errors
def models(
    input_size: int = typer.Option(28, help="Input side in pixels."),
    channels: int = typer.Option(1, help="Input channels."),
    num_classes: int = typer.Option(10, help="Number of classes."),
) -> None:
    """List architectures with their parameter count at the given input setting."""
    import torch
    from rich.console import Console
    from rich.table import Table

    from capsmed.errors import CapsmedError
    from capsmed.models import count_parameters, create_model, list_models

    table = Table(title=f"Architectures at {channels}x{input_size}x{input_size}, "
                        f"{num_classes} classes")
    for column in ("name", "parameters", "description", "options (--model-arg key=value)",
                   "reference"):
        table.add_column(column, justify="right" if column == "parameters" else "left",
                         overflow="fold")
    for entry in list_models():
        try:
            # The meta device allocates no storage: counting the 6.7 billion parameters
            # of the baseline at 400x400 must not need 27 GB of memory.
            with torch.device("meta"):
                model = create_model(entry.name, in_channels=channels,
                                     num_classes=num_classes, input_size=input_size)
            params = f"{count_parameters(model):,}"
        except CapsmedError as exc:
            params = f"n/a ({exc})"
        options = " ".join(f"{k}={v}".replace(" ", "") for k, v in entry.defaults().items()
                            if k not in UNIFORM_ARGUMENTS)
        table.add_row(entry.name, params, entry.description, options, entry.paper)
    Console().print(table)
