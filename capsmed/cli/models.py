"""``capsmed models``: registered architectures and their parameter counts."""

from __future__ import annotations

from typing import Any

import typer

from capsmed.cli.common import handles_errors
from capsmed.cli.json_output import json_option, print_json

# Set by the trainer from the dataset, so not listed as options.
UNIFORM_ARGUMENTS = {"in_channels", "num_classes", "input_size", "input_mean", "input_std"}


@handles_errors
def models(
    input_size: int = typer.Option(28, help="Input side in pixels."),
    channels: int = typer.Option(1, help="Input channels."),
    num_classes: int = typer.Option(10, help="Number of classes."),
    as_json: bool = json_option(),
) -> None:
    """List architectures with their parameter count at the given input setting."""
    from capsmed.errors import CapsmedError
    from capsmed.tables import Column, Table
    from capsmed.tables.terminal import print_tables

    for name, value, least in (("--input-size", input_size, 1), ("--channels", channels, 1),
                               ("--num-classes", num_classes, 2)):
        if value < least:
            raise CapsmedError(f"{name} must be >= {least}, got {value}")
    entries = _architectures(input_size, channels, num_classes)
    if as_json:
        print_json(entries)
        return
    rows = []
    for e in entries:
        params = "n/a" if e["parameters"] is None else f"{e['parameters']:,}"
        note = f" Not at this input: {e['note']}" if e["note"] else ""
        options = " ".join(f"{k}={_as_typed(v)}" for k, v in e["options"].items())
        rows.append([f"{e['name']}\n{params}", f"{e['description']}{note}\n"
                     f"[{e['paper']}]", options])
    # name over its count, description over its reference, and the options, whose
    # key=value words are never split: the prose columns share what the first leaves
    print_tables([Table(f"Architectures at {channels}x{input_size}x{input_size}, "
                        f"{num_classes} classes",
                        [Column("name\nparameters", align="left"),
                         Column("description\n[reference]", align="left", wrap=True),
                         Column("options (--model-arg key=value)", align="left", wrap=True)],
                        rows, row_rules=True)])


def _architectures(input_size: int, channels: int, num_classes: int) -> list[dict[str, Any]]:
    """Each registered architecture: name, parameter count at this input (None where it
    cannot take it, ``note`` saying why), description, paper and its options' defaults."""
    import torch

    from capsmed.errors import CapsmedError
    from capsmed.models import count_parameters, create_model, list_models

    out = []
    for entry in list_models():
        params, note = None, None
        try:
            # The meta device allocates no storage: counting the 6.7 billion parameters
            # of the baseline at 400x400 must not need 27 GB of memory.
            with torch.device("meta"):
                model = create_model(entry.name, in_channels=channels,
                                     num_classes=num_classes, input_size=input_size)
            params = count_parameters(model)
        except CapsmedError as exc:
            note = str(exc)
        options = {k: v for k, v in entry.defaults().items() if k not in UNIFORM_ARGUMENTS}
        out.append({"name": entry.name, "parameters": params, "note": note,
                    "description": entry.description, "paper": entry.paper,
                    "options": options})
    return out


def _as_typed(value: object) -> str:
    """A default as ``--model-arg key=value`` reads it back (YAML: [3,4], null, true)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_as_typed(v) for v in value) + "]"
    return str(value).replace(" ", "")
