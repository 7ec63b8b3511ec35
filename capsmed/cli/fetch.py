"""``capsmed fetch <dataset>``: download a public dataset's raw files, checksum-verified.

Only the command group lives here; sources that can be downloaded register their
command from ``capsmed/cli/sources/<source>.py``.
"""

from __future__ import annotations

import typer

app = typer.Typer(help="Download a public dataset's raw files (verified by checksum).",
                  no_args_is_help=True)
