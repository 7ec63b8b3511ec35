"""One module per data source; importing it registers that source's commands.

A module here adds ``capsmed preprocess <source>`` and ``capsmed synth <source>`` (and
``capsmed fetch <source>`` where the data can be downloaded) to the groups defined in
``capsmed/cli/{preprocess,synth,fetch}.py``. New sources need no edit elsewhere.
"""

from __future__ import annotations

import importlib
import pkgutil


def register_all() -> None:
    """Import every source module (alphabetical order is the order ``--help`` lists)."""
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{module}")
