"""Drawing primitives for synthetic blood-smear cells (May-Grünwald-Giemsa look).

Shapes are signed-distance fields on the image grid (negative inside, in pixels), so
unions (``np.minimum``), cut-outs (``np.maximum(a, -b)``) and soft edges (:func:`soft`)
compose freely. Colour is optical density (OD): stains add up in OD and the image is
``255 * exp(-OD)`` (Beer-Lambert), so overlapping granules over a nucleus darken it
the way they do under the microscope.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np

from capsmed.data.synth.histology import sigmoid


def optical_density(rgb: Sequence[float]) -> np.ndarray:
    """OD (3,) of a stain that looks like ``rgb`` (0-255) on a white background."""
    rgb = np.clip(np.asarray(rgb, dtype=np.float32) / 255.0, 1.0 / 255.0, 1.0)
    return -np.log(rgb)


def od_to_rgb(od: np.ndarray, rng: np.random.Generator, noise: float = 1.5) -> np.ndarray:
    """(H, W, 3) optical density -> uint8 RGB with sensor noise of ``noise`` grey levels."""
    rgb = 255.0 * np.exp(-od) + noise * rng.standard_normal(od.shape, dtype=np.float32)
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


class Grid:
    """Pixel-centre coordinates of a square image (rows ``y``, columns ``x``)."""

    def __init__(self, size: int, y: np.ndarray | None = None,
                 x: np.ndarray | None = None) -> None:
        self.size = size
        if y is None or x is None:
            axis = np.arange(size, dtype=np.float32) + 0.5
            y, x = np.meshgrid(axis, axis, indexing="ij")
        self.y, self.x = y, x

    def window(self, cy: float, cx: float, radius: float) -> tuple[tuple[slice, slice], Grid]:
        """The box around (cy, cx) (clamped to the image) and its coordinates as a Grid.

        Shapes far smaller than the image are drawn in their box only: much faster.
        """
        y0, x0 = (min(max(int(v - radius), 0), self.size) for v in (cy, cx))
        y1, x1 = (min(max(int(v + radius) + 2, 0), self.size) for v in (cy, cx))
        sl = (slice(y0, max(y1, y0)), slice(x0, max(x1, x0)))
        return sl, Grid(self.size, self.y[sl], self.x[sl])


def soft(distance: np.ndarray, edge: float) -> np.ndarray:
    """Soft inside-mask (1 inside, 0 outside) of a signed distance, blurred over ``edge`` px."""
    return sigmoid(-distance, max(edge, 0.3)).astype(np.float32)


def wobble(rng: np.random.Generator, amount: float) -> tuple[float, ...]:
    """Random low-harmonic outline deformation (amplitudes and phases of harmonics 2-4)."""
    return tuple(float(v) for v in (*rng.uniform(-amount, amount, 3),
                                    *rng.uniform(0, 2 * math.pi, 3)))


def ellipse(g: Grid, cy: float, cx: float, a: float, b: float, theta: float = 0.0,
            outline: tuple[float, ...] | None = None) -> np.ndarray:
    """Approximate signed distance to an ellipse (semi-axes a, b) with a wobbly outline."""
    dy, dx = g.y - cy, g.x - cx
    c, s = math.cos(theta), math.sin(theta)
    u, v = dx * c + dy * s, dy * c - dx * s
    r = np.sqrt((u / a) ** 2 + (v / b) ** 2)
    if outline:
        phi = np.arctan2(v / b, u / a)
        amp, phase = outline[:3], outline[3:]
        r = r / (1.0 + sum(m * np.cos((k + 2) * phi + p)
                           for k, (m, p) in enumerate(zip(amp, phase, strict=True))))
    return (r - 1.0) * math.sqrt(a * b)


def capsule(g: Grid, p0: Sequence[float], p1: Sequence[float], r0: float,
            r1: float | None = None) -> np.ndarray:
    """Signed distance to a segment p0-p1 (y, x) thickened by a radius tapering r0 -> r1."""
    r1 = r0 if r1 is None else r1
    (y0, x0), (y1, x1) = p0, p1
    vy, vx = y1 - y0, x1 - x0
    t = ((g.y - y0) * vy + (g.x - x0) * vx) / max(vy * vy + vx * vx, 1e-6)
    t = np.clip(t, 0.0, 1.0)
    d = np.hypot(g.y - (y0 + t * vy), g.x - (x0 + t * vx))
    return d - (r0 + t * (r1 - r0))


def polyline(g: Grid, points: np.ndarray, radii: Sequence[float]) -> np.ndarray:
    """Signed distance to a chain of capsules through ``points`` (K, 2) with K radii."""
    out = capsule(g, points[0], points[1], radii[0], radii[1])
    for k in range(1, len(points) - 1):
        out = np.minimum(out, capsule(g, points[k], points[k + 1], radii[k], radii[k + 1]))
    return out


def arc_points(cy: float, cx: float, radius: float, start: float, span: float,
               count: int) -> np.ndarray:
    """``count`` (y, x) points on a circular arc from angle ``start`` over ``span`` rad."""
    t = start + np.linspace(0.0, span, count)
    return np.stack([cy + radius * np.sin(t), cx + radius * np.cos(t)], axis=1)


def sample_inside(rng: np.random.Generator, weight: np.ndarray, count: int) -> np.ndarray:
    """``count`` (y, x) points drawn with probability proportional to ``weight`` (H, W)."""
    flat = np.clip(weight, 0, None).ravel().astype(np.float64)
    total = flat.sum()
    if count <= 0 or total <= 0:
        return np.empty((0, 2), dtype=np.float32)
    idx = rng.choice(flat.size, size=count, p=flat / total)
    y, x = np.divmod(idx, weight.shape[1])
    jitter = rng.uniform(0.0, 1.0, (count, 2))
    return (np.stack([y, x], axis=1) + jitter).astype(np.float32)


def dots(shape: tuple[int, int], points: np.ndarray, sigma: float,
         strength: np.ndarray | float = 1.0) -> np.ndarray:
    """Gaussian dots (peak ~ ``strength``) at ``points``: granules, chromatin clumps."""
    impulses = np.zeros(shape, dtype=np.float32)
    if len(points):
        iy = np.clip(points[:, 0].astype(np.int64), 0, shape[0] - 1)
        ix = np.clip(points[:, 1].astype(np.int64), 0, shape[1] - 1)
        np.add.at(impulses, (iy, ix), np.broadcast_to(strength, (len(points),)))
    sigma = max(sigma, 0.5)
    # A blurred unit impulse peaks at 1 / (2 pi sigma^2); rescale so one dot peaks at 1.
    return cv2.GaussianBlur(impulses, (0, 0), sigma) * (2.0 * math.pi * sigma * sigma)


def streaks(rng: np.random.Generator, size: int, length: float, width: float) -> np.ndarray:
    """Unit-variance noise stretched along a random direction (smeared chromatin)."""
    noise = rng.standard_normal((size, size)).astype(np.float32)
    noise = cv2.GaussianBlur(noise, (0, 0), sigmaX=max(length, 0.5), sigmaY=max(width, 0.5))
    turn = cv2.getRotationMatrix2D((size / 2, size / 2), float(rng.uniform(0, 180)), 1.0)
    noise = cv2.warpAffine(noise, turn, (size, size), borderMode=cv2.BORDER_REFLECT)
    return noise / (noise.std() + 1e-6)


def red_cells(rng: np.random.Generator, g: Grid, count: int, radius: tuple[float, float],
              keep_out: tuple[float, float, float]) -> np.ndarray:
    """Soft OD weight (H, W) of biconcave red cells: discs with a paler centre.

    Centres avoid the disc ``keep_out`` = (cy, cx, r) where the leukocyte sits, and may lie
    just outside the image so cells are cut by its border, as in the real crops.
    """
    out = np.zeros(g.y.shape, dtype=np.float32)
    cy, cx, keep = keep_out
    placed = 0
    for _ in range(count * 30):
        if placed == count:
            break
        r = rng.uniform(*radius)
        y, x = rng.uniform(-0.5 * r, g.size + 0.5 * r, 2)
        if math.hypot(y - cy, x - cx) < keep + 0.6 * r:
            continue
        a, b = r * rng.uniform(0.95, 1.08), r * rng.uniform(0.88, 1.0)
        theta = rng.uniform(0, math.pi)
        sl, box = g.window(y, x, 1.3 * a + 3)
        disc = soft(ellipse(box, y, x, a, b, theta, wobble(rng, 0.03)), 1.0)
        pallor = soft(ellipse(box, y, x, 0.5 * a, 0.5 * b, theta), 0.25 * r)
        # Overlapping red cells stack (OD adds), as they do where they overlap in a smear.
        out[sl] += disc * (1.0 - rng.uniform(0.35, 0.6) * pallor)
        placed += 1
    return out
