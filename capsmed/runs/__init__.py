"""The run folder, read back: one way to open a run (:func:`open_run`), its checkpoint,
the rows it is scored on and the index of many runs.

``capsmed train`` writes a run folder (:mod:`capsmed.train`); everything that reads one
(evaluate, the analyses, predict, report, ``runs ls`` and the pipeline runner) goes
through this layer, which sits above training and below those commands.

``open_run`` and ``OpenRun`` are imported on first use: opening a run needs torch, and
the light parts (the index, the rows) are read where torch is not wanted (the
pipeline runner's checks).
"""

from __future__ import annotations

from typing import Any

__all__ = ["OpenRun", "open_run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from capsmed.runs import open as opened

        return getattr(opened, name)
    raise AttributeError(f"module 'capsmed.runs' has no attribute {name!r}")
