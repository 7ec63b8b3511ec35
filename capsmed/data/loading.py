"""How a split is held while a run trains (:mod:`capsmed.data.loader`): on the device,
streamed from the file, or chosen by size. Standard library only: training's options
read it without importing torch."""

from __future__ import annotations

LOADINGS = ("auto", "memory", "stream")
