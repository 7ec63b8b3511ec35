"""Synthetic DIARETDB1 v1.1 fundus data, written in the official on-disk layout.

The real release cannot be downloaded here, so tests and benchmarks run the real reader
on images drawn by this module: a circular field of view on black (one ``fmask.tif``
for all images, as in the release), an orange-red retina lit from the centre, an optic
disc with its cup, a darker macula, a vessel tree leaving the disc in four arcades, and
the four lesion types DIARETDB1 annotates:

* hard exudates: clusters of small sharp bright-yellow deposits, mostly around the macula;
* soft exudates (cotton-wool spots): pale, fluffy, blurred patches;
* haemorrhages: dark-red blots with ragged edges;
* red small dots (microaneurysms): tiny dark-red dots.

Each lesion gets a marking in its type's fused confidence map (3-channel PNG, equal
channels) at the share of four experts who marked it: 64, 128, 191 or 255. Agreed
lesions often carry a wider, less confident halo, so the confidence threshold changes
both which lesions count and how large they are. 191/255 = 0.749 falls just below the
toolkit's 0.75: only four-expert markings pass it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import tifffile

from capsmed.data.sources.diaretdb1.fundus import (
    FOV_RADIUS,
    draw_blob,
    fundus_mask,
    retina_background,
    vessel_tree,
)
from capsmed.data.sources.diaretdb1.layout import (
    FUNDUS_MASK,
    GROUND_TRUTH_DIR,
    IMAGES_DIR,
    LESION_TYPES,
    TEST_LIST,
    TRAIN_LIST,
)
from capsmed.errors import CapsmedError
from capsmed.io import atomic_dir
from capsmed.progress import track

log = logging.getLogger(__name__)

MAX_IMAGES = 89
NATIVE_SIZE = (1500, 1152)  # width, height of every DIARETDB1 image
# The official trainset.txt (28 images); the other 61 are in testset.txt. Paper 000's
# public code swapped the two lists (its test list holds exactly these numbers).
OFFICIAL_TRAIN = frozenset({1, 3, 4, 9, 10, 11, 13, 14, 20, 22, 24, 25, 26, 27, 28, 29, 35,
                            36, 38, 42, 53, 55, 57, 64, 70, 79, 84, 86})
LEVELS = (64, 128, 191, 255)  # 1, 2, 3 or 4 of four experts marked the region
LEVEL_ODDS = (0.1, 0.2, 0.25, 0.45)
NORMAL_SHARE = 5 / 89  # DIARETDB1: 5 of 89 images show no sign of retinopathy

_EXUDATE = (250.0, 226.0, 110.0)
_COTTON_WOOL = (236.0, 218.0, 178.0)
_BLOOD = (105.0, 18.0, 10.0)


@dataclass(frozen=True)
class SynthFundus:
    """One rendered image and the truth behind it.

    Attributes:
        rgb: (H, W, 3) uint8 image.
        confidence: Fused confidence map (H, W) uint8 per lesion type.
        lesions: ``(type, row, col, radius, level)`` of every drawn lesion.
    """

    rgb: np.ndarray
    confidence: dict[str, np.ndarray]
    lesions: list[tuple[str, int, int, float, int]] = field(default_factory=list)


@dataclass(frozen=True)
class SynthSummary:
    """What :func:`write_diaretdb1` wrote."""

    root: Path
    images: int
    train: int
    test: int
    lesions: dict[str, int]


def _mark(conf: np.ndarray, rng: np.random.Generator, y: float, x: float,
          radius: float) -> int:
    """Mark a circle around a lesion at a random agreement level (plus a halo); -> level."""
    k = int(rng.choice(4, p=LEVEL_ODDS))
    outer = radius * rng.uniform(1.4, 1.8) if k > 0 and rng.random() < 0.6 else radius
    h, w = conf.shape
    y0, x0 = max(0, int(y - outer) - 1), max(0, int(x - outer) - 1)
    y1, x1 = min(h, int(y + outer) + 2), min(w, int(x + outer) + 2)
    if y0 >= y1 or x0 >= x1:
        return LEVELS[k]
    local = np.zeros((y1 - y0, x1 - x0), np.uint8)
    centre = (round(x) - x0, round(y) - y0)
    if outer > radius:  # fewer experts drew it wider
        cv2.circle(local, centre, round(outer), LEVELS[k - 1], -1)
    cv2.circle(local, centre, max(1, round(radius)), LEVELS[k], -1)
    np.maximum(conf[y0:y1, x0:x1], local, out=conf[y0:y1, x0:x1])
    return LEVELS[k]


def _spots(rng: np.random.Generator, n: int, centre: tuple[float, float], reach: float,
           mask: np.ndarray, avoid: tuple[float, float, float]) -> list[tuple[float, float]]:
    """``n`` points within ``reach`` of ``centre``, inside the fundus, away from the disc."""
    h, w = mask.shape
    out: list[tuple[float, float]] = []
    for _ in range(50 * n + 50):
        if len(out) == n:
            break
        r, a = reach * math.sqrt(rng.random()), rng.uniform(0, 2 * math.pi)
        y, x = centre[0] + r * math.sin(a), centre[1] + r * math.cos(a)
        inside = 0 <= y < h and 0 <= x < w and mask[int(y), int(x)]
        if inside and math.hypot(y - avoid[0], x - avoid[1]) > avoid[2]:
            out.append((y, x))
    return out


def render_fundus_image(rng: np.random.Generator, width: int, height: int,
                        normal: bool = False) -> SynthFundus:
    """Draw one synthetic fundus photograph and its four confidence maps.

    Args:
        rng: Source of all randomness (the image is a pure function of its state).
        width: Image width in pixels (DIARETDB1: 1500; sizes scale with it).
        height: Image height in pixels (DIARETDB1: 1152).
        normal: Draw no lesions (a healthy eye).

    Returns:
        The image, its confidence maps and the lesions drawn.
    """
    s = width / NATIVE_SIZE[0]
    mask = fundus_mask(width, height)
    rgb = retina_background(rng, width, height, mask)
    side = rng.choice((-1.0, 1.0))  # left or right eye: which side the disc is on
    disc_r = rng.uniform(0.06, 0.07) * width
    disc = (height / 2 + rng.uniform(-0.06, 0.06) * height, width / 2 + side * 0.27 * width)
    fovea = (height / 2 + rng.uniform(-0.03, 0.03) * height, disc[1] - side * 5 * disc_r)
    towards_macula = math.atan2(fovea[0] - disc[0], fovea[1] - disc[1])

    draw_blob(rng, rgb, *fovea, 0.07 * width, 0.07 * width, (95.0, 35.0, 15.0), 0.35, 0.6)
    dark = vessel_tree(rng, (height, width), disc, disc_r, towards_macula, s)
    rgb *= (1 - np.array([0.45, 0.6, 0.6], np.float32) * dark[..., None])
    draw_blob(rng, rgb, *disc, disc_r, disc_r * rng.uniform(0.9, 1.1), (245.0, 205.0, 140.0),
              0.9, 0.06, 0.04)
    draw_blob(rng, rgb, *disc, 0.4 * disc_r, 0.35 * disc_r, (252.0, 240.0, 200.0), 0.8, 0.3)

    conf = {kind: np.zeros((height, width), np.uint8) for kind in LESION_TYPES}
    lesions: list[tuple[str, int, int, float, int]] = []
    avoid = (*disc, 1.5 * disc_r)
    everywhere = ((height / 2, width / 2), 0.85 * FOV_RADIUS * width)

    def add(kind: str, y: float, x: float, radius: float) -> None:
        lesions.append((kind, int(y), int(x), radius,
                        _mark(conf[kind], rng, y, x, radius)))

    if not normal:
        for y, x in _spots(rng, rng.poisson(rng.uniform(0, 3)), fovea, 0.2 * width, mask,
                           avoid):
            spread = rng.uniform(15, 60) * s
            for by, bx in _spots(rng, int(rng.integers(5, 26)), (y, x), spread, mask, avoid):
                r = max(1.0, rng.uniform(2, 7) * s)
                draw_blob(rng, rgb, by, bx, r, r * rng.uniform(0.7, 1.3), _EXUDATE, 0.9,
                          0.1, 0.15)
            add("hardexudates", y, x, spread + 8 * s)
        for y, x in _spots(rng, rng.poisson(rng.uniform(0, 1.5)), *everywhere, mask, avoid):
            r = rng.uniform(15, 35) * s
            draw_blob(rng, rgb, y, x, r, r * rng.uniform(0.6, 1.0), _COTTON_WOOL, 0.65, 0.5,
                      0.2)
            add("softexudates", y, x, 1.3 * r + 4 * s)
        for y, x in _spots(rng, rng.poisson(rng.uniform(0, 6)), *everywhere, mask, avoid):
            ry, rx = rng.uniform(8, 35, 2) * s
            draw_blob(rng, rgb, y, x, ry, rx, _BLOOD, 0.85, 0.15, 0.25)
            add("hemorrhages", y, x, 1.3 * max(ry, rx) + 3 * s)
        for y, x in _spots(rng, rng.poisson(rng.uniform(0, 15)), *everywhere, mask, avoid):
            r = max(1.2, rng.uniform(2.5, 5) * s)
            draw_blob(rng, rgb, y, x, r, r, _BLOOD, 0.8, 0.2)
            add("redsmalldots", y, x, 1.5 * r + 3 * s)

    noise = rng.uniform(1.5, 3.0) * rng.standard_normal(rgb.shape, dtype=np.float32)
    rgb = np.clip(np.rint(rgb + noise * mask[..., None]), 0, 255).astype(np.uint8)
    for kind in LESION_TYPES:
        conf[kind][~mask] = 0  # experts mark inside the field of view only
    return SynthFundus(rgb=rgb, confidence=conf, lesions=lesions)


def write_diaretdb1(out_dir: Path, *, images: int = 12, size: tuple[int, int] = (500, 384),
                    seed: int = 0, disable_progress: bool | None = None) -> SynthSummary:
    """Write a synthetic DIARETDB1 v1.1 tree (``resources/...``) to ``out_dir`` (atomically).

    Images are numbered 001..``images``; each goes to the official list its number is in
    (``trainset.txt`` or ``testset.txt``), one ``images/ddb1_fundusimages/imageNNN.png``
    per line.

    Args:
        out_dir: Folder to create; must not exist or be empty.
        images: Number of images, 1-89.
        size: (width, height); the release's is (1500, 1152).
        seed: Image N is drawn from ``default_rng([seed, N])``.
        disable_progress: Hide the progress bar (None: follow the global setting).

    Returns:
        The root and counts of what was written.
    """
    out_dir = Path(out_dir)
    width, height = size
    if not 1 <= images <= MAX_IMAGES:
        raise CapsmedError(f"{out_dir}: images must be 1-{MAX_IMAGES}, got {images}")
    if width < 64 or height < 64:
        raise CapsmedError(f"{out_dir}: size must be at least 64x64, got {width}x{height}")
    if seed < 0:
        raise CapsmedError(f"{out_dir}: seed must be >= 0, got {seed}")
    counts = dict.fromkeys(LESION_TYPES, 0)
    numbers = list(range(1, images + 1))
    with atomic_dir(out_dir) as tmp:
        res = tmp / "resources"
        for sub in [IMAGES_DIR, Path(FUNDUS_MASK).parent, Path(TRAIN_LIST).parent,
                    Path(TEST_LIST).parent] + [f"{GROUND_TRUTH_DIR}/{k}" for k in LESION_TYPES]:
            (res / sub).mkdir(parents=True, exist_ok=True)
        mask = fundus_mask(width, height)
        tifffile.imwrite(res / FUNDUS_MASK, mask.astype(np.uint8) * 255, photometric="minisblack")
        for n in track(numbers, "Synthesising DIARETDB1", disable=disable_progress):
            rng = np.random.default_rng([seed, n])
            synth = render_fundus_image(rng, width, height, normal=rng.random() < NORMAL_SHARE)
            name = f"image{n:03d}.png"
            cv2.imwrite(str(res / IMAGES_DIR / name), synth.rgb[..., ::-1])  # RGB -> BGR
            for kind, values in synth.confidence.items():
                cv2.imwrite(str(res / GROUND_TRUTH_DIR / kind / name),
                            np.repeat(values[..., None], 3, axis=2))
            for kind, *_ in synth.lesions:
                counts[kind] += 1
        for path, members in ((TRAIN_LIST, [n for n in numbers if n in OFFICIAL_TRAIN]),
                              (TEST_LIST, [n for n in numbers if n not in OFFICIAL_TRAIN])):
            (res / path).write_text("".join(f"{IMAGES_DIR}/image{n:03d}.png\n"
                                            for n in members), encoding="utf-8")
    train = sum(n in OFFICIAL_TRAIN for n in numbers)
    log.info("wrote %d synthetic DIARETDB1 images (%dx%d; %s) to %s", images, width, height,
             ", ".join(f"{k} {v}" for k, v in counts.items()), out_dir)
    return SynthSummary(root=out_dir, images=images, train=train, test=images - train,
                        lesions=counts)
