"""The options of ``capsmed predict`` (frozen dataclasses; no heavy imports, so the
command line can read their defaults for its help)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from capsmed.data.replay.options import Overrides

SHAPES = ("tile", "point")


@dataclass(frozen=True)
class PredictOptions:
    """How to predict (every field has a default; the CLI overrides only what is given).

    Attributes:
        overrides: Changes to the replayed preprocessing (stride, tissue, level, ...).
        class_name: The class of heatmaps and GeoJSON positives (default: the second
            class, e.g. mitosis or lesion; the first when there is one).
        threshold: A window is positive when its score of that class is >= this.
        shape: GeoJSON objects: ``tile`` (window squares, detections) or ``point``.
        batch_size: Windows per forward pass.
        device: ``auto``, ``cpu``, ``cuda``, ``mps``.
        centres: CSV of ``input,x,y`` window centres to score instead of a grid.
        data: The run's dataset file, for runs without ``preprocessing.json``.
        heatmaps: Draw a heatmap PNG per input (about half a second each).
        keep_going: Skip unreadable inputs (listed in summary.json) instead of stopping.
        overwrite: Replace an existing output folder.
        disable_progress: Hide progress bars (None: the global setting).
    """

    overrides: Overrides = field(default_factory=Overrides)
    class_name: str | None = None
    threshold: float = 0.5
    shape: str = "tile"
    batch_size: int = 512
    device: str = "auto"
    centres: Path | None = None
    data: Path | None = None
    heatmaps: bool = True
    keep_going: bool = False
    overwrite: bool = False
    disable_progress: bool | None = None
