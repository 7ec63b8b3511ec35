"""A tiny class-folder dataset (``ROOT/<class>/P03_0001.png``) for tests and examples.

Each class is one shape (circle, square, triangle, cross, ring) drawn in a random
colour, size, position and rotation on a noisy background, so the classes can be told
apart by shape only. The ``P<patient>_`` prefix lets ``--group-pattern '^(P\\d+)_'``
group images by patient.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from capsmed.errors import CapsmedError
from capsmed.io import atomic_dir
from capsmed.progress import track

log = logging.getLogger(__name__)

SHAPES = ("circle", "square", "triangle", "cross", "ring")


@dataclass(frozen=True)
class FolderSynthSummary:
    """What :func:`write_class_folders` wrote."""

    root: Path
    classes: tuple[str, ...]
    images: int
    patients: int


def draw_shape(rng: np.random.Generator, shape: str, size: int) -> np.ndarray:
    """One ``size`` x ``size`` RGB uint8 image of ``shape`` on a noisy background."""
    background = rng.uniform(40, 200)
    image = np.clip(rng.normal(background, 12, (size, size, 3)), 0, 255).astype(np.uint8)
    colour = tuple(int(v) for v in (background + rng.choice([-1, 1]) * rng.uniform(50, 90)
                                    + rng.uniform(-30, 30, 3)).clip(0, 255))
    r = size * rng.uniform(0.2, 0.32)
    cy, cx = rng.uniform(r + 2, size - r - 2, 2)
    theta = rng.uniform(0, 2 * math.pi)
    thick = max(2, round(r / 3))

    def polygon(corners: int) -> np.ndarray:
        a = theta + np.arange(corners) * 2 * math.pi / corners
        return np.stack([cx + r * np.cos(a), cy + r * np.sin(a)], 1).round().astype(np.int32)

    centre = (round(cx), round(cy))
    if shape == "circle":
        cv2.circle(image, centre, round(r), colour, -1, cv2.LINE_AA)
    elif shape == "ring":
        cv2.circle(image, centre, round(r), colour, thick, cv2.LINE_AA)
    elif shape in ("square", "triangle"):
        cv2.fillPoly(image, [polygon(4 if shape == "square" else 3)], colour, cv2.LINE_AA)
    else:  # cross: two bars through the centre
        ends = polygon(4)
        cv2.line(image, tuple(ends[0]), tuple(ends[2]), colour, thick, cv2.LINE_AA)
        cv2.line(image, tuple(ends[1]), tuple(ends[3]), colour, thick, cv2.LINE_AA)
    return image


def write_class_folders(out_dir: Path, *, classes: int = 3, images_per_class: int = 12,
                        patients: int = 6, size: int = 64, seed: int = 0,
                        disable_progress: bool | None = None) -> FolderSynthSummary:
    """Write ``out_dir/<shape>/P<pp>_<nnnn>.png`` (atomically; deterministic for a seed).

    Args:
        out_dir: Folder to create; must not exist or be empty.
        classes: Number of classes (2-5), named after their shapes.
        images_per_class: PNGs per class, numbered 0001.. within the class.
        patients: Patients P01.. that images are spread over (round-robin, shuffled).
        size: Image side in pixels (16-1024).
        seed: Random seed.
        disable_progress: Hide the progress bar.

    Returns:
        The root and counts of what was written.
    """
    out_dir = Path(out_dir)
    if not 2 <= classes <= len(SHAPES):
        raise CapsmedError(f"{out_dir}: classes must be 2-{len(SHAPES)}, got {classes}")
    if not 1 <= images_per_class <= 9999 or not 1 <= patients <= 99:
        raise CapsmedError(f"{out_dir}: need 1-9999 images per class and 1-99 patients")
    if not 16 <= size <= 1024:
        raise CapsmedError(f"{out_dir}: size must be 16-1024, got {size}")
    if seed < 0:  # NumPy's generator failed on it with a traceback
        raise CapsmedError(f"{out_dir}: seed must be >= 0, got {seed}")
    names = SHAPES[:classes]
    rng = np.random.default_rng(seed)
    jobs = [(c, i, p) for c in range(classes)
            for i, p in enumerate(rng.permutation(np.arange(images_per_class) % patients) + 1,
                                  start=1)]
    with atomic_dir(out_dir) as tmp:
        for c, i, p in track(jobs, "Synthesising class folders", disable=disable_progress):
            image = draw_shape(np.random.default_rng([seed, c, i]), names[c], size)
            path = tmp / names[c] / f"P{p:02d}_{i:04d}.png"
            path.parent.mkdir(exist_ok=True)
            if not cv2.imwrite(str(path), image[..., ::-1]):  # OpenCV writes BGR
                raise CapsmedError(f"{path}: cannot write PNG")
    log.info("wrote %d images in %d class folders to %s", len(jobs), classes, out_dir)
    return FolderSynthSummary(out_dir, names, len(jobs), min(patients, images_per_class))
