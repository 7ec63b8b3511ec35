"""Synthetic TUPAC16 auxiliary mitosis data, written in the official on-disk layout.

The real archives cannot be downloaded here, so tests and ``make demo`` run on images
drawn by this module. They imitate H&E breast-cancer histology at 40x (0.25 um/px):
white non-tissue regions, fibrous pink stroma, nests of purple tumour nuclei, mitotic
figures (metaphase bars, anaphase/telophase pairs, clumped prophase chromatin) and
non-mitotic look-alikes (hyperchromatic nuclei, apoptotic bodies, lymphocytes).

Colour follows Beer-Lambert with the Ruifrok-Johnston stain vectors that
``skimage.color.rgb2hed`` inverts, so ``rgb2hed(rgb)[..., 0] == cH / ln(1e6)`` wherever
nothing clips: the hematoxylin channel the preprocessing extracts is the drawn one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import tifffile

from capsmed.data.sources.tupac16.reader import GROUND_TRUTH_DIR
from capsmed.data.synth.histology import (
    Canvas,
    draw_lookalike,
    draw_mitosis,
    draw_nucleus,
    fibres,
    place,
    sigmoid,
    smooth_field,
)
from capsmed.errors import CapsmedError
from capsmed.io import atomic_dir
from capsmed.progress import track

log = logging.getLogger(__name__)

H_STAIN: tuple[float, float, float] = (0.65, 0.70, 0.29)
E_STAIN: tuple[float, float, float] = (0.07, 0.99, 0.11)

# 11.5 per megapixel gives a Poisson mean of ~3 mitoses on a 512 x 512 image.
DEFAULT_MITOSES_PER_MEGAPIXEL = 11.5
LOOKALIKES_PER_MEGAPIXEL = 85.0  # look-alike events (a lymphocyte group counts once)
MAX_CASES = 73
# Official archive split of cases into parts: part 1 holds 01-14, part 2 15-33, part 3 34-73.
PART_RANGES = ((1, 14), (15, 33), (34, 73))
MIN_MITOSIS_SPACING = 30  # px between mitosis centres
H_CLIP = 2.2  # ceiling on cH so the darkest channel stays well above 0 (linear rgb2hed)

_H = np.array(H_STAIN, dtype=np.float32)
_E = np.array(E_STAIN, dtype=np.float32)


@dataclass(frozen=True)
class SynthImage:
    """One rendered image and the truth behind it.

    Attributes:
        rgb: (H, W, 3) uint8 image.
        hematoxylin: (H, W) float32 hematoxylin concentration cH (natural-log OD units).
        mitoses: (K, 2) int64 (row, col) centres of mitotic figures; K may be 0.
        lookalikes: (L, 2) int64 (row, col) centres of non-mitotic look-alike nuclei.
    """

    rgb: np.ndarray
    hematoxylin: np.ndarray
    mitoses: np.ndarray
    lookalikes: np.ndarray


@dataclass(frozen=True)
class SynthSummary:
    """What :func:`write_tupac16` wrote."""

    root: Path
    images: int
    mitoses: int
    cases: int



def render_tupac16_image(rng: np.random.Generator, size: int,
                         mitoses_per_megapixel: float = DEFAULT_MITOSES_PER_MEGAPIXEL
                         ) -> SynthImage:
    """Draw one synthetic H&E mitosis image of ``size`` x ``size`` pixels.

    Args:
        rng: Source of all randomness (the image is a pure function of its state).
        size: Side in pixels (0.25 um/px, so a nucleus is ~25-45 px across).
        mitoses_per_megapixel: Poisson rate of mitotic figures.

    Returns:
        The image, its hematoxylin concentration and the mitosis / look-alike centres.

    Raises:
        ValueError: ``size`` below 32 or a negative rate.
    """
    if size < 32 or mitoses_per_megapixel < 0:
        raise ValueError(f"need size >= 32 and a rate >= 0, got {size}, {mitoses_per_megapixel}")
    shape = (size, size)
    cv = Canvas(rng, size)
    # Tissue vs white lumen / fat / glass: threshold a smooth field at a random quantile.
    bg_field = smooth_field(rng, shape, rng.uniform(70, 140))
    threshold = np.quantile(bg_field[::4, ::4], rng.uniform(0.08, 0.28))
    tissue = sigmoid(bg_field - threshold, 0.015)
    # Cellularity: tumour nests (dense nuclei, smooth cytoplasm) vs fibrous stroma.
    cells = sigmoid(smooth_field(rng, shape, rng.uniform(50, 100)) + rng.uniform(-0.6, 0.8),
                     0.5)
    fib = np.clip(0.5 + 0.3 * fibres(rng, shape), 0, 1)
    stroma_e = rng.uniform(0.25, 0.4) + rng.uniform(0.2, 0.35) * fib
    cyto_e = rng.uniform(0.25, 0.4) + 0.04 * cv.grain
    cv.ce[:] = tissue * (cells * cyto_e + (1 - cells) * stroma_e)
    cv.ch[:] = tissue * (rng.uniform(0.05, 0.1) + 0.05 * cells + 0.02 * fib)

    density = rng.uniform(0.8e-3, 1.6e-3) * size * size
    for y, x in rng.uniform(0, size, (rng.poisson(density), 2)):
        iy, ix = int(y), int(x)
        if rng.random() < tissue[iy, ix] * (0.12 + 0.88 * cells[iy, ix]):
            draw_nucleus(rng, cv, y, x, tumour=rng.random() < cells[iy, ix])

    area_mpx = size * size / 1e6
    mitoses = place(rng, tissue, rng.poisson(mitoses_per_megapixel * area_mpx),
                     MIN_MITOSIS_SPACING, [], 0)
    seeds = place(rng, tissue, rng.poisson(LOOKALIKES_PER_MEGAPIXEL * area_mpx), 14,
                   mitoses, 45)
    lookalikes: list[tuple[float, float]] = []
    for y, x in seeds:
        lookalikes += draw_lookalike(rng, cv, float(y), float(x), mitoses)
    for y, x in mitoses:
        draw_mitosis(rng, cv, int(y), int(x))

    # Mild optical blur, then Beer-Lambert colour and sensor noise.
    ch = np.clip(cv2.GaussianBlur(cv.ch, (0, 0), 0.7), 0, H_CLIP)
    ce = np.clip(cv2.GaussianBlur(cv.ce, (0, 0), 0.7), 0, 1.0)
    od = ch[..., None] * _H + ce[..., None] * _E
    noise = rng.uniform(1.0, 2.5) * rng.standard_normal(od.shape, dtype=np.float32)
    rgb = np.clip(np.rint(255.0 * np.exp(-od) + noise), 0, 255).astype(np.uint8)

    la = np.rint(np.asarray(lookalikes, dtype=np.float64)).astype(np.int64).reshape(-1, 2)
    inside = ((la >= 0) & (la < size)).all(axis=1)
    return SynthImage(rgb=rgb, hematoxylin=ch.astype(np.float32), mitoses=mitoses,
                      lookalikes=la[inside])


def case_part(case: int) -> int:
    """The official archive part (1, 2 or 3) that holds ``case``."""
    for part, (lo, hi) in enumerate(PART_RANGES, start=1):
        if lo <= case <= hi:
            return part
    raise ValueError(f"case {case} is outside 1..{MAX_CASES}")


def write_tupac16(out_dir: Path, *, cases: int = 6, images_per_case: int = 4, size: int = 512,
                  seed: int = 0, layout: str = "official",
                  disable_progress: bool | None = None) -> SynthSummary:
    """Write a synthetic TUPAC16 mitosis dataset to ``out_dir`` (atomically).

    Args:
        out_dir: Folder to create; must not exist or be empty.
        cases: Number of cases, numbered 01..``cases`` (1-73, as in the real data).
        images_per_case: Images per case (1-99, two-digit names).
        size: Image side in pixels (>= 128).
        seed: Image (seed, case, image) is drawn from ``default_rng([seed, case, image])``.
        layout: ``"official"`` (part folders + ``mitoses_ground_truth``) or ``"flat"``
            (``<CC>/<NN>.tif`` with ``<NN>.csv`` beside it).
        disable_progress: Hide the progress bar (None: follow the global setting).

    Returns:
        The root and counts of what was written.
    """
    out_dir = Path(out_dir)
    if not 1 <= cases <= MAX_CASES:
        raise CapsmedError(f"{out_dir}: cases must be 1-{MAX_CASES}, got {cases}")
    if not 1 <= images_per_case <= 99:  # names are two digits
        raise CapsmedError(f"{out_dir}: images_per_case must be 1-99, got {images_per_case}")
    if size < 128:
        raise CapsmedError(f"{out_dir}: size must be >= 128, got {size}")
    if seed < 0:
        raise CapsmedError(f"{out_dir}: seed must be >= 0, got {seed}")
    if layout not in ("official", "flat"):
        raise CapsmedError(f"{out_dir}: layout must be 'official' or 'flat', got {layout!r}")

    jobs = [(c, i) for c in range(1, cases + 1) for i in range(1, images_per_case + 1)]
    total_mitoses = 0
    with atomic_dir(out_dir) as tmp:
        for case, image in track(jobs, "Synthesising TUPAC16", disable=disable_progress):
            synth = render_tupac16_image(np.random.default_rng([seed, case, image]), size)
            cc, nn = f"{case:02d}", f"{image:02d}"
            if layout == "official":
                tif = tmp / f"mitoses_image_data_part_{case_part(case)}" / cc / f"{nn}.tif"
                csv = tmp / GROUND_TRUTH_DIR / cc / f"{nn}.csv"
            else:
                tif = tmp / cc / f"{nn}.tif"
                csv = tif.with_suffix(".csv")
            tif.parent.mkdir(parents=True, exist_ok=True)
            csv.parent.mkdir(parents=True, exist_ok=True)
            tifffile.imwrite(tif, synth.rgb, photometric="rgb")
            if len(synth.mitoses):  # as in the real data, no mitoses means no CSV at all
                csv.write_text("".join(f"{r},{c}\n" for r, c in synth.mitoses.tolist()),
                               encoding="utf-8")
            total_mitoses += len(synth.mitoses)
    log.info("wrote %d synthetic TUPAC16 images (%d cases, %d mitoses, %s layout) to %s",
             len(jobs), cases, total_mitoses, layout, out_dir)
    return SynthSummary(root=out_dir, images=len(jobs), mitoses=total_mitoses, cases=cases)
