"""Drawing primitives for synthetic colour fundus photographs.

Everything is drawn in float32 RGB (0-255) on the full canvas, but every shape only
touches its own bounding box, so a 1500x1152 image with hundreds of lesions and a
vessel tree renders in a fraction of a second. Sizes are given at DIARETDB1's native
resolution (1500 px wide) and scaled by ``scale = width / 1500``.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from capsmed.data.synth.histology import sigmoid, smooth_field

FOV_RADIUS = 0.47  # of the width: a 1500 px image has a 1410 px circle, cut at top/bottom


def fundus_mask(width: int, height: int) -> np.ndarray:
    """The camera's circular field of view (truncated by the image's top and bottom)."""
    yy, xx = np.ogrid[:height, :width]
    cy, cx, r = (height - 1) / 2, (width - 1) / 2, FOV_RADIUS * width
    return (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r


def _box(shape: tuple[int, int], y: float, x: float, reach: float):
    """Slices and local coordinates of the square of half-side ``reach`` around (y, x)."""
    h, w = shape
    y0, y1 = max(0, int(y - reach)), min(h, int(math.ceil(y + reach)) + 1)
    x0, x1 = max(0, int(x - reach)), min(w, int(math.ceil(x + reach)) + 1)
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    return (slice(y0, y1), slice(x0, x1)), yy - y, xx - x


def blend(rgb: np.ndarray, alpha: np.ndarray, where: tuple[slice, slice],
          colour: tuple[float, float, float]) -> None:
    """Mix ``colour`` into ``rgb[where]`` with per-pixel opacity ``alpha`` (0-1), in place."""
    a = alpha[..., None]
    rgb[where] = rgb[where] * (1 - a) + np.asarray(colour, np.float32) * a


def blob_alpha(rng: np.random.Generator, ry: float, rx: float, angle: float, yy: np.ndarray,
               xx: np.ndarray, softness: float, ragged: float) -> np.ndarray:
    """Opacity of an ellipse (radii ry, rx, rotated) with a noisy, soft edge.

    ``softness`` is the edge width as a fraction of the radius; ``ragged`` the relative
    amplitude of the edge's irregularity (0 = a clean ellipse).
    """
    c, s = math.cos(angle), math.sin(angle)
    u, v = (xx * c + yy * s) / max(rx, 0.5), (-xx * s + yy * c) / max(ry, 0.5)
    dist = np.sqrt(u * u + v * v)
    if ragged > 0 and dist.size > 16:
        noise = cv2.resize(np.clip(rng.standard_normal((6, 6)), -1.5, 1.5).astype(np.float32),
                           dist.shape[::-1], interpolation=cv2.INTER_CUBIC)
        dist = dist * (1 + ragged * noise)
    return sigmoid(1.0 - dist, max(softness, 0.02)).astype(np.float32)


def draw_blob(rng: np.random.Generator, rgb: np.ndarray, y: float, x: float, ry: float,
              rx: float, colour: tuple[float, float, float], opacity: float,
              softness: float = 0.15, ragged: float = 0.0) -> None:
    """A soft-edged, optionally ragged elliptical blob (lesion, disc, cup)."""
    # far enough out that the soft, ragged edge has faded to nothing (no square cut-off)
    reach = max(ry, rx) * (1 + 4 * softness) / (1 - 1.5 * min(ragged, 0.4)) + 2
    where, yy, xx = _box(rgb.shape[:2], y, x, reach)
    alpha = opacity * blob_alpha(rng, ry, rx, rng.uniform(0, math.pi), yy, xx, softness, ragged)
    blend(rgb, alpha, where, colour)


def retina_background(rng: np.random.Generator, width: int, height: int,
                      mask: np.ndarray) -> np.ndarray:
    """Orange-red retina lit from the centre, with choroidal mottling; black outside."""
    scale = width / 1500
    base = np.array([rng.uniform(185, 225), rng.uniform(75, 105), rng.uniform(25, 45)],
                    np.float32)
    yy, xx = np.ogrid[:height, :width]
    r2 = ((yy - height / 2) ** 2 + (xx - width / 2) ** 2) / (FOV_RADIUS * width) ** 2
    light = (1.0 - rng.uniform(0.3, 0.45) * r2).astype(np.float32)
    light *= 1 + 0.06 * smooth_field(rng, (height, width), 260 * scale)
    mottling = 0.05 * smooth_field(rng, (height, width), 25 * scale + 2)
    rgb = base * (light * (1 + mottling))[..., None]
    # the field of view's rim is a little soft, as in a real camera
    edge = cv2.GaussianBlur(mask.astype(np.float32), (0, 0), 2.0 * scale + 0.5)
    return rgb * edge[..., None]


def vessel_tree(rng: np.random.Generator, shape: tuple[int, int], disc: tuple[float, float],
                disc_radius: float, towards_macula: float, scale: float) -> np.ndarray:
    """Darkness map (0-1) of retinal vessels leaving the optic disc in four arcades.

    Each branch is a random walk with a drifting heading; it thins as it goes, spawns
    thinner children at random, and stops at the field of view's edge.
    """
    h, w = shape
    canvas = np.zeros(shape, dtype=np.uint8)
    cy, cx, limit = (h - 1) / 2, (w - 1) / 2, FOV_RADIUS * w
    step = max(2.0, 6.0 * scale)
    # temporal arcades arch above and below the macula; nasal ones go the other way
    headings = [towards_macula - 0.9, towards_macula + 0.9, towards_macula + math.pi - 0.7,
                towards_macula + math.pi + 0.7]
    stack = [(disc[0], disc[1], a + rng.normal(0, 0.1), rng.uniform(9, 13) * scale,
              rng.uniform(0.75, 1.0) * w, 0, rng.uniform(0.4, 0.6)) for a in headings]
    # arcades curve back towards the macula: the sign of the bend depends on the side
    bends = [0.0012, -0.0012, -0.0008, 0.0008]
    while stack:
        y, x, heading, width, length, depth, darkness = stack.pop()
        bend = (bends[len(stack) % 4] if depth == 0 else rng.normal(0, 0.002)) / scale
        travelled = 0.0
        while travelled < length and width >= 0.7:
            heading += rng.normal(0, 0.06) + bend * step
            ny, nx = y + step * math.sin(heading), x + step * math.cos(heading)
            if (ny - cy) ** 2 + (nx - cx) ** 2 > limit ** 2:
                break
            cv2.line(canvas, (round(x), round(y)), (round(nx), round(ny)),
                     int(255 * darkness), max(1, round(width)), cv2.LINE_AA)
            if depth < 3 and rng.random() < step / (260 * scale + 1):
                side = rng.choice((-1.0, 1.0))
                stack.append((ny, nx, heading + side * rng.uniform(0.4, 1.0), width * 0.65,
                              (length - travelled) * rng.uniform(0.4, 0.8), depth + 1,
                              darkness * 0.9))
            y, x, travelled, width = ny, nx, travelled + step, width * (1 - 0.0015 / scale * step)
    # the disc hides the vessels' trunks a little
    darkness = cv2.GaussianBlur(canvas.astype(np.float32) / 255.0, (0, 0), 0.5 * scale + 0.4)
    yy, xx = np.ogrid[:h, :w]
    near = np.sqrt((yy - disc[0]) ** 2 + (xx - disc[1]) ** 2) < 0.6 * disc_radius
    darkness[near] *= 0.5
    return darkness
