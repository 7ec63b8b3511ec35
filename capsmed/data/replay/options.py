"""What the user may change of a replayed preprocessing (``capsmed predict``'s options
--stride, --min-tissue, --level, --mpp, --fov-mask). Standard library only: the command
line reads it for its help."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Overrides:
    """What the user may change of the replayed preprocessing (None: as recorded).

    Attributes:
        stride: Step of the window grid in source pixels (default: the recorded stride,
            else half the patch; for wsi runs the tile).
        min_tissue: Least tissue (field-of-view) share of a kept window.
        level: Slide pyramid level to read (tupac16 and wsi runs, slides only).
        mpp: Microns per pixel to read slides at (tupac16 and wsi runs, slides only).
        fov_mask: DIARETDB1 field-of-view mask image (default: estimated per image).
    """

    stride: int | None = None
    min_tissue: float | None = None
    level: int | None = None
    mpp: float | None = None
    fov_mask: Path | None = None
