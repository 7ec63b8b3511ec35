"""``capsmed synth <dataset>``: synthetic data in the official on-disk layouts.

Only the command group lives here; each source registers its command from
``capsmed/cli/sources/<source>.py``.
"""

from __future__ import annotations

import typer

app = typer.Typer(help="Write synthetic data in a dataset's official layout (for tests, "
                       "demos and trying the pipeline without the real download).",
                  no_args_is_help=True)
