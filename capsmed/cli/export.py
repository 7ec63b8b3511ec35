"""``capsmed export RUN_DIR -o FILE``: the run's model as an ONNX, TorchScript or
``torch.export`` file that runs without capsmed."""

from __future__ import annotations

from pathlib import Path

import typer

from capsmed.cli.common import handles_errors
from capsmed.cli.options import OUTPUT_FLAGS

EPILOG = ("Example: capsmed export runs/caps-s1 -o caps.onnx; then in Python: "
          "onnxruntime.InferenceSession('caps.onnx').run(None, {'images': x}) with x "
          "float32 [N, C, H, W] in [0, 1]. The file's metadata (ONNX metadata_props "
          "'capsmed', or the extra file capsmed.json) names the classes, the input and "
          "the preprocessing to replay on raw images.")


@handles_errors
def export(
    run_dir: Path = typer.Argument(..., help="A run directory written by capsmed train."),
    # a str, not a Path: Path("exports/") drops the "/" that says a folder was meant
    output: str = typer.Option(..., *OUTPUT_FLAGS, metavar="<path>", show_default=False,
                               help="The file to write (a file name, not a folder)."),
    fmt: str = typer.Option(None, "--format", help="onnx (ONNX Runtime; needs "
                            "'capsmed[export]'), torchscript or exported-program "
                            "(torch.export) [the one FILE's suffix names: .onnx, "
                            ".pt/.pth, .pt2; else onnx].", show_default=False),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace FILE if it exists.",
                                   show_default=False),
) -> None:
    """Write the run's model returning its class scores, with its classes, input and
    preprocessing as metadata; the file is loaded back and checked before it is kept."""
    from capsmed.runs.export import export_run

    export_run(run_dir, output, fmt, overwrite=overwrite)  # logs "wrote <file> (...)" once
