"""``capsmed preprocess <dataset>``: raw files -> one HDF5 dataset file.

Only the command group lives here; each source registers its command from
``capsmed/cli/sources/<source>.py``.
"""

from __future__ import annotations

import typer

app = typer.Typer(help="Turn a raw dataset into one HDF5 file (the dataset contract).",
                  no_args_is_help=True)
