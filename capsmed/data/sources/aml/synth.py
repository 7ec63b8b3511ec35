"""Synthetic AML-Cytomorphology_LMU data, written in the release's on-disk layout.

One leukocyte per image, centred, on a pale pink smear background with red cells, as
in the release's 400x400 crops (100x oil objective, so a red cell is ~70 px across).
Each class has the features a cytologist uses to name it: nucleus shape (multi-lobed
segmented neutrophil, C-shaped band, kidney-shaped monocyte and metamyelocyte, bilobed
eosinophil and promyelocyte, round dense lymphocyte and erythroblast nucleus, large
fine-chromatin blast nucleus with nucleoli, smeared smudge cell), nucleus/cytoplasm
ratio, cytoplasm colour and granules (orange-red eosinophil, dark basophil, purple
azurophilic promyelocyte granules). Colours are optical densities (see ``cells.py``).

Class counts follow the release's imbalance scaled down, and ``annotations.dat`` holds
re-annotations that agree, disagree, are undecidable (UNC) or absent (nan).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import tifffile

from capsmed.data.sources.aml.cells import (
    Grid,
    arc_points,
    capsule,
    dots,
    ellipse,
    od_to_rgb,
    optical_density,
    polyline,
    red_cells,
    sample_inside,
    soft,
    streaks,
    wobble,
)
from capsmed.data.sources.aml.layout import (
    ANNOTATIONS,
    CLASS_NAMES,
    IMAGE_DIR,
    NOT_REANNOTATED,
    RELEASE_COUNTS,
    UNDECIDABLE,
)
from capsmed.data.synth.histology import fine_noise, smooth_field
from capsmed.errors import CapsmedError
from capsmed.io import atomic_dir
from capsmed.progress import track

log = logging.getLogger(__name__)

REFERENCE_SIZE = 400  # the release's image side; radii below are in its pixels
BACKGROUND = (236, 218, 222)
RED_CELL = (222, 150, 158)
REANNOTATION_KINDS = ("agree", "disagree", "undecidable")


@dataclass(frozen=True)
class CellStyle:
    """How one class looks (radii in pixels of a 400x400 image, colours as RGB on white).

    Attributes:
        radius: Range of the cell radius.
        nucleus: Nucleus shape: round, eccentric, kidney, band, segmented, bilobed,
            irregular or smudge.
        ratio: Range of nucleus size relative to the cell radius.
        nucleus_rgb / cytoplasm_rgb: Stain colours (cytoplasm None: no cytoplasm).
        chromatin: (contrast, grain sigma) of the chromatin texture; fine grain = blast.
        granules: (count per 1000 px^2 of cell at 400 px, sigma px, RGB, over nucleus).
        nucleoli: Range of the number of pale nucleoli.
    """

    radius: tuple[float, float]
    nucleus: str
    ratio: tuple[float, float]
    nucleus_rgb: tuple[int, int, int]
    cytoplasm_rgb: tuple[int, int, int] | None
    chromatin: tuple[float, float] = (0.25, 2.5)
    granules: tuple[float, float, tuple[int, int, int], bool] | None = None
    nucleoli: tuple[int, int] = (0, 0)


_NEUTRO_CYTO = (228, 205, 220)
_FINE = (2.2, 1.4, (200, 150, 190), False)  # neutrophilic "dust"
STYLES: dict[str, CellStyle] = {
    "NGS": CellStyle((52, 62), "segmented", (0.24, 0.3), (95, 45, 125), _NEUTRO_CYTO,
                     granules=_FINE),
    "NGB": CellStyle((52, 62), "band", (0.2, 0.25), (95, 45, 125), _NEUTRO_CYTO,
                     granules=_FINE),
    "LYT": CellStyle((34, 44), "round", (0.8, 0.88), (70, 35, 115), (175, 195, 235),
                     chromatin=(0.3, 3.0)),
    "LYA": CellStyle((44, 58), "irregular", (0.68, 0.78), (105, 60, 150), (145, 170, 225),
                     chromatin=(0.2, 2.0)),
    "MON": CellStyle((64, 80), "kidney", (0.55, 0.65), (140, 95, 170), (195, 190, 215),
                     chromatin=(0.3, 1.6)),
    "EOS": CellStyle((55, 65), "bilobed", (0.28, 0.34), (90, 45, 120), (235, 205, 195),
                     granules=(9.0, 3.0, (225, 110, 70), False)),
    "BAS": CellStyle((48, 58), "irregular", (0.5, 0.6), (130, 85, 160), (215, 195, 220),
                     granules=(4.5, 3.4, (55, 25, 85), True)),
    "MYO": CellStyle((58, 78), "round", (0.74, 0.84), (150, 100, 185), (140, 155, 215),
                     chromatin=(0.15, 1.0), nucleoli=(1, 3)),
    "PMO": CellStyle((68, 85), "eccentric", (0.55, 0.65), (135, 85, 170), (175, 165, 215),
                     chromatin=(0.18, 1.3), granules=(3.5, 2.2, (140, 50, 115), True),
                     nucleoli=(0, 2)),
    "PMB": CellStyle((68, 85), "bilobed", (0.33, 0.4), (135, 85, 170), (175, 165, 215),
                     chromatin=(0.18, 1.3), granules=(3.5, 2.2, (140, 50, 115), True)),
    "MYB": CellStyle((58, 70), "eccentric", (0.5, 0.6), (110, 60, 140), (220, 195, 215),
                     chromatin=(0.35, 2.6), granules=(3.0, 1.6, (190, 130, 180), False)),
    "MMZ": CellStyle((55, 65), "kidney", (0.52, 0.6), (100, 55, 135), (225, 200, 215),
                     chromatin=(0.35, 2.6), granules=_FINE),
    "MOB": CellStyle((70, 90), "round", (0.7, 0.8), (155, 110, 190), (165, 175, 215),
                     chromatin=(0.12, 1.0), nucleoli=(1, 2)),
    "EBO": CellStyle((38, 50), "round", (0.55, 0.65), (45, 20, 70), (155, 160, 210),
                     chromatin=(0.2, 2.0)),
    "KSC": CellStyle((50, 80), "smudge", (1.0, 1.0), (150, 105, 180), None,
                     chromatin=(0.5, 2.0)),
}


def _nucleus(rng: np.random.Generator, g: Grid, kind: str, cy: float, cx: float,
             cell_r: float, r: float, s: float) -> np.ndarray:
    """Signed distance of a nucleus of shape ``kind`` and size ``r`` in a cell at (cy, cx)."""
    theta = rng.uniform(0, 2 * math.pi)
    if kind == "eccentric":  # pushed toward the cell border (myelocyte, promyelocyte)
        off = (cell_r - r) * rng.uniform(0.55, 0.8)
        cy, cx = cy + off * math.sin(theta), cx + off * math.cos(theta)
    if kind in ("round", "eccentric"):
        return ellipse(g, cy, cx, r, r * rng.uniform(0.85, 1.0), theta, wobble(rng, 0.04))
    if kind == "irregular":
        return ellipse(g, cy, cx, r, r * rng.uniform(0.75, 0.95), theta, wobble(rng, 0.12))
    if kind == "kidney":  # an oval with a bite out of one side
        body = ellipse(g, cy, cx, 1.15 * r, 0.85 * r, theta, wobble(rng, 0.05))
        by, bx = cy + 1.05 * r * math.cos(theta), cx - 1.05 * r * math.sin(theta)
        return np.maximum(body, -ellipse(g, by, bx, 0.6 * r, 0.55 * r, theta))
    if kind == "band":  # a C-shaped sausage of even width, slightly tapered ends
        span = rng.uniform(3.4, 4.6)
        pts = arc_points(cy, cx, cell_r * rng.uniform(0.42, 0.5), theta, span, 14)
        radii = r * (1 + 0.12 * np.sin(np.linspace(0, math.pi, 14)))
        return polyline(g, pts, radii * np.r_[0.75, np.ones(12), 0.75])
    if kind == "segmented":  # 3-5 lobes joined by thin chromatin filaments
        count = int(rng.integers(3, 6))
        pts = arc_points(cy, cx, cell_r * rng.uniform(0.38, 0.48), theta,
                         rng.uniform(3.6, 5.0), count)
        pts += rng.normal(0, 0.06 * cell_r, pts.shape)
        out = polyline(g, pts, [max(0.9, 2.2 * s)] * count)
        for y, x in pts:
            lobe_r = r * rng.uniform(0.85, 1.15)
            out = np.minimum(out, ellipse(g, y, x, lobe_r, lobe_r * rng.uniform(0.7, 0.9),
                                          rng.uniform(0, math.pi), wobble(rng, 0.06)))
        return out
    if kind == "bilobed":  # two round lobes joined by a bridge ("pince-nez")
        off = cell_r * rng.uniform(0.34, 0.42)
        dy, dx = off * math.sin(theta), off * math.cos(theta)
        lobes = [ellipse(g, cy + sgn * dy, cx + sgn * dx, r * rng.uniform(0.9, 1.1),
                         r * rng.uniform(0.75, 0.9), theta + math.pi / 2, wobble(rng, 0.05))
                 for sgn in (-1, 1)]
        bridge = capsule(g, (cy - dy, cx - dx), (cy + dy, cx + dx), max(1.0, 0.3 * r))
        return np.minimum(np.minimum(*lobes), bridge)
    if kind == "smudge":  # a broken, smeared nucleus with ragged outline
        return ellipse(g, cy, cx, r * rng.uniform(1.1, 1.4), r * rng.uniform(0.6, 0.9),
                       theta, wobble(rng, 0.22))
    raise ValueError(f"unknown nucleus kind {kind!r}")


def render_cell(rng: np.random.Generator, label: str, size: int = REFERENCE_SIZE) -> np.ndarray:
    """Draw one single-cell image of class ``label`` as (size, size, 4) RGBA uint8 (opaque).

    Raises:
        ValueError: unknown class or ``size`` below 32.
    """
    if label not in STYLES or size < 32:
        raise ValueError(f"need a known class and size >= 32, got {label!r}, {size}")
    st, s, g = STYLES[label], size / REFERENCE_SIZE, Grid(size)
    shape = (size, size)
    od = optical_density(BACKGROUND) * (1 + 0.06 * smooth_field(rng, shape, 120 * s))[..., None]
    cell_r = rng.uniform(*st.radius) * s
    cy, cx = size / 2 + rng.normal(0, 0.03 * size, 2)
    reds = red_cells(rng, g, int(rng.integers(5, 13)), (30 * s, 38 * s), (cy, cx, cell_r))
    od = od + reds[..., None] * optical_density(RED_CELL)

    nuc_r = rng.uniform(*st.ratio) * cell_r  # lobe / band half-width for lobed kinds
    nuc_sd = _nucleus(rng, g, st.nucleus, cy, cx, cell_r, nuc_r, s)
    nucleus = soft(nuc_sd, 1.2 * s + 0.3)
    grain = fine_noise(rng, shape, max(0.7, st.chromatin[1] * s))
    nuc_od = optical_density(st.nucleus_rgb) * np.clip(1 + st.chromatin[0] * grain, 0.3,
                                                       None)[..., None]
    if st.nucleus == "smudge":  # chromatin smeared into streaks, thinning at the edge
        smear = streaks(rng, size, 14 * s, 2.0 * s) + 0.6 * smooth_field(rng, shape, 25 * s)
        nucleus = nucleus * np.clip(0.5 + 0.22 * smear, 0.05, 1.0) * soft(nuc_sd + 6 * s,
                                                                        12 * s)
    if st.nucleoli[1]:
        n = int(rng.integers(st.nucleoli[0], st.nucleoli[1] + 1))
        core = soft(nuc_sd + 0.45 * nuc_r, 1.0)  # well inside the nucleus
        for y, x in sample_inside(rng, core, n):
            spot = soft(ellipse(g, y, x, 7 * s + 0.5, 6 * s + 0.5, rng.uniform(0, math.pi)),
                        1.5 * s + 0.3)
            nuc_od = nuc_od * (1 - 0.5 * spot)[..., None]

    if st.cytoplasm_rgb is None:
        cyto = np.zeros(shape, np.float32)
        cell_od = nucleus[..., None] * nuc_od
    else:
        cyto = soft(ellipse(g, cy, cx, cell_r, cell_r * rng.uniform(0.88, 1.0),
                            rng.uniform(0, math.pi), wobble(rng, 0.05)), 1.5 * s + 0.3)
        texture = 1 + 0.08 * fine_noise(rng, shape, max(0.7, 2 * s))
        cyto_od = optical_density(st.cytoplasm_rgb) * texture[..., None]
        if label == "MON":  # vacuoles: small clear holes in the cytoplasm
            holes = dots(shape, sample_inside(rng, cyto * (1 - nucleus), 6), 3 * s)
            cyto_od = cyto_od * np.clip(1 - 0.6 * holes, 0.2, 1)[..., None]
        cell_od = (cyto * (1 - nucleus))[..., None] * cyto_od + nucleus[..., None] * nuc_od
    cover = np.maximum(cyto, nucleus)[..., None]
    od = od * (1 - cover) + cell_od  # the leukocyte lies over the background

    if st.granules is not None:
        per_kpx, sigma, rgb, over_nucleus = st.granules
        where = cyto if over_nucleus else cyto * (1 - nucleus)
        # the density is per 1000 px^2 at 400 px, so a cell keeps its granules at any size
        count = rng.poisson(per_kpx * float(cyto.sum()) / (s * s) / 1000.0)
        gran = dots(shape, sample_inside(rng, where, int(count)), sigma * s,
                    rng.uniform(0.6, 1.1, int(count)).astype(np.float32))
        od = od + np.clip(gran, 0, 1.3)[..., None] * optical_density(rgb)
    if label == "MYO" and rng.random() < 0.25:  # an Auer rod: a thin red needle
        spot = sample_inside(rng, cyto * (1 - nucleus), 1)
        y, x = spot[0] if len(spot) else (cy, cx)
        t = rng.uniform(0, math.pi)
        half = 9 * s
        rod = soft(capsule(g, (y - half * math.sin(t), x - half * math.cos(t)),
                           (y + half * math.sin(t), x + half * math.cos(t)), 1.2 * s + 0.3),
                   0.6)
        od = od + rod[..., None] * optical_density((170, 60, 110))
    od = cv2.GaussianBlur(od.astype(np.float32), (0, 0), 0.5 * s + 0.3)
    rgb = od_to_rgb(od, rng)
    return np.concatenate([rgb, np.full((size, size, 1), 255, np.uint8)], axis=2)


def class_counts(per_class_scale: float, min_per_class: int) -> dict[str, int]:
    """Images per class: the release's counts times the scale, at least ``min_per_class``."""
    return {c: max(min_per_class, round(per_class_scale * RELEASE_COUNTS[c]))
            for c in CLASS_NAMES}


def _reannotations(rng: np.random.Generator, labels: list[str],
                   fraction: float) -> list[tuple[str, str]]:
    """Two re-annotations per image; with >= 3 images every kind occurs at least once."""
    out = [(NOT_REANNOTATED, NOT_REANNOTATED)] * len(labels)
    kinds: list[str | None] = [None] * len(labels)
    for i in np.flatnonzero(rng.random(len(labels)) < fraction):
        kinds[i] = str(rng.choice(REANNOTATION_KINDS, p=[0.6, 0.2, 0.2]))
    for kind in REANNOTATION_KINDS:  # tests and demos need one of each
        free = [i for i, k in enumerate(kinds) if k is None]
        if kind not in kinds and free:
            kinds[int(rng.choice(free))] = kind
    for i, (label, kind) in enumerate(zip(labels, kinds, strict=True)):
        other = str(rng.choice([c for c in CLASS_NAMES if c != label]))
        if kind == "agree":
            out[i] = (label, label)
        elif kind == "disagree":
            out[i] = [(other, other), (other, label), (label, other)][int(rng.integers(3))]
        elif kind == "undecidable":
            out[i] = [(UNDECIDABLE, UNDECIDABLE), (UNDECIDABLE, label), (label, UNDECIDABLE),
                      (other, UNDECIDABLE)][int(rng.integers(4))]
    return out


@dataclass(frozen=True)
class SynthSummary:
    """What :func:`write_aml` wrote: counts per class and each annotation line's fields."""

    root: Path
    counts: dict[str, int]
    annotations: tuple[tuple[str, str, str, str], ...]

    @property
    def images(self) -> int:
        return sum(self.counts.values())


def write_aml(out_dir: Path, *, per_class_scale: float = 0.005, size: int = REFERENCE_SIZE,
              seed: int = 0, min_per_class: int = 2, reannotated_fraction: float = 0.2,
              disable_progress: bool | None = None) -> SynthSummary:
    """Write a synthetic AML-Cytomorphology_LMU release to ``out_dir`` (atomically).

    Layout: ``out_dir/AML-Cytomorphology/<CLS>/<CLS>_NNNN.tiff`` (RGBA) and
    ``out_dir/annotations.dat``.

    Args:
        out_dir: Folder to create; must not exist or be empty.
        per_class_scale: Fraction of the release's count per class (0.005: 42 NGS).
        size: Image side in pixels (the release: 400).
        seed: Image NNNN of class CLS is drawn from ``default_rng([seed, class, NNNN])``.
        min_per_class: Floor on the images per class, so rare classes exist.
        reannotated_fraction: Share of images given two re-annotations.
        disable_progress: Hide the progress bar.

    Returns:
        Counts per class and the annotation fields written.
    """
    out_dir = Path(out_dir)
    if not 0 < per_class_scale <= 1:
        raise CapsmedError(f"{out_dir}: per-class scale must be in (0, 1], got "
                           f"{per_class_scale}")
    if size < 32 or min_per_class < 1 or seed < 0 or not 0 <= reannotated_fraction <= 1:
        raise CapsmedError(f"{out_dir}: need size >= 32, min per class >= 1, seed >= 0 and "
                           f"a re-annotated fraction in [0, 1]; got {size}, {min_per_class}, "
                           f"{seed}, {reannotated_fraction}")
    counts = class_counts(per_class_scale, min_per_class)
    # The release lists images folder by folder in alphabetical order.
    jobs = [(c, n) for c in sorted(CLASS_NAMES) for n in range(1, counts[c] + 1)]
    if any(n > 9999 for _, n in jobs):
        raise CapsmedError(f"{out_dir}: more than 9999 images in a class (names are 4 digits)")
    labels = [c for c, _ in jobs]
    reann = _reannotations(np.random.default_rng([seed, len(CLASS_NAMES)]), labels,
                           reannotated_fraction)
    lines = tuple((f"{c}/{c}_{n:04d}.tiff", c, *r) for (c, n), r in zip(jobs, reann,
                                                                        strict=True))
    with atomic_dir(out_dir) as tmp:
        for (label, number), fields in track(list(zip(jobs, lines, strict=True)),
                                             "Synthesising AML", disable=disable_progress):
            rng = np.random.default_rng([seed, CLASS_NAMES.index(label), number])
            path = tmp / IMAGE_DIR / fields[0]
            path.parent.mkdir(parents=True, exist_ok=True)
            tifffile.imwrite(path, render_cell(rng, label, size), photometric="rgb",
                             extrasamples=["unassalpha"])
        (tmp / ANNOTATIONS).write_text("".join(" ".join(f) + "\n" for f in lines),
                                       encoding="utf-8")
    log.info("wrote %d synthetic AML images (%s) to %s", len(jobs),
             ", ".join(f"{c} {counts[c]}" for c in CLASS_NAMES), out_dir)
    return SynthSummary(root=out_dir, counts=counts, annotations=lines)
