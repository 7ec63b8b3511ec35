"""Drawing primitives for synthetic H&E histology (stain concentration maps).

Shapes are drawn into hematoxylin / eosin concentration maps (:class:`Canvas`); a
dataset module turns them into RGB with the Beer-Lambert law. Every drawing works on
a local bounding box, so rendering is vectorised and fast.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

BORDER = 4  # px: closest a placed centre (e.g. a mitosis) comes to the image edge


def sigmoid(x: np.ndarray, width: float) -> np.ndarray:
    """Soft step 0 -> 1 across ``x = 0`` over about ``width`` (float32, overflow-safe)."""
    return 1.0 / (1.0 + np.exp(-np.clip(x / width, -30.0, 30.0)))


def smooth_field(rng: np.random.Generator, shape: tuple[int, int], scale: float) -> np.ndarray:
    """Zero-mean, unit-variance noise varying over ~``scale`` px (cheap: upsampled)."""
    h, w = shape
    low = rng.standard_normal((max(3, round(h / scale) + 2), max(3, round(w / scale) + 2)))
    low = cv2.GaussianBlur(low.astype(np.float32), (0, 0), 0.8)
    field = cv2.resize(low, (w, h), interpolation=cv2.INTER_CUBIC)
    return (field - field.mean()) / (field.std() + 1e-6)


def fine_noise(rng: np.random.Generator, shape: tuple[int, int], sigma: float) -> np.ndarray:
    """Unit-variance white noise blurred by ``sigma`` px: chromatin grain and ragged edges."""
    field = cv2.GaussianBlur(rng.standard_normal(shape, dtype=np.float32), (0, 0), sigma)
    return field / (field.std() + 1e-6)


def fibres(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Collagen-like texture: white noise filtered by elongated Gaussians in Fourier space.

    Two fibre directions are blended by a smooth field so bundles bend across the image.
    """
    h, w = shape
    spectrum = np.fft.rfft2(rng.standard_normal(shape, dtype=np.float32))
    fy = np.fft.fftfreq(h).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(w).astype(np.float32)[None, :]
    out = []
    for theta in rng.uniform(0, np.pi) + np.array([0.0, rng.uniform(0.5, 1.2)]):
        along = fx * math.cos(theta) + fy * math.sin(theta)
        across = -fx * math.sin(theta) + fy * math.cos(theta)
        s_long, s_thin = rng.uniform(8, 16), rng.uniform(1.0, 1.8)
        gain = np.exp(-2 * np.pi**2 * ((s_long * along) ** 2 + (s_thin * across) ** 2))
        f = np.fft.irfft2(spectrum * gain, s=shape).astype(np.float32)
        out.append(f / (f.std() + 1e-6))
    blend = sigmoid(smooth_field(rng, shape, 90.0), 0.5)
    return blend * out[0] + (1 - blend) * out[1]


class Canvas:
    """Stain concentration maps plus the noise fields shapes borrow texture from."""

    def __init__(self, rng: np.random.Generator, size: int) -> None:
        self.shape = (size, size)
        self.ch = np.zeros(self.shape, np.float32)
        self.ce = np.zeros(self.shape, np.float32)
        self.grain = fine_noise(rng, self.shape, 1.3)  # chromatin mottling
        self.rag = fine_noise(rng, self.shape, 0.9)  # ragged, hairy outlines

    def window(self, cy: float, cx: float, radius: float):
        """Slices and centred (dy, dx) coordinate vectors of a box around (cy, cx)."""
        h, w = self.shape
        # clamped so a box partly (or wholly) off the image is cut, never wrapped around
        y0, x0 = min(max(int(cy - radius), 0), h), min(max(int(cx - radius), 0), w)
        y1, x1 = max(min(int(cy + radius) + 2, h), y0), max(min(int(cx + radius) + 2, w), x0)
        dy = (np.arange(y0, y1, dtype=np.float32) - cy)[:, None]
        dx = (np.arange(x0, x1, dtype=np.float32) - cx)[None, :]
        return (slice(y0, y1), slice(x0, x1)), dy, dx

    def add_h(self, sl: tuple[slice, slice], value: np.ndarray) -> None:
        """Overlapping nuclei take the darker value rather than adding up (no saturation)."""
        np.maximum(self.ch[sl], value, out=self.ch[sl])

    def dim_e(self, sl: tuple[slice, slice], mask: np.ndarray, amount: float) -> None:
        """Nuclei displace eosin-stained cytoplasm, which keeps them purple-blue."""
        self.ce[sl] *= 1.0 - amount * mask


def _rotate(dy: np.ndarray, dx: np.ndarray, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """(u along the axis at angle theta, v across it)."""
    c, s = math.cos(theta), math.sin(theta)
    return dx * c + dy * s, dy * c - dx * s


def _ellipse_mask(rng, cv: Canvas, cy, cx, a, b, *, edge, wobble):
    """Window, normalised radius and soft mask of a slightly irregular ellipse."""
    sl, dy, dx = cv.window(cy, cx, a * 1.35 + 3)
    u, v = _rotate(dy, dx, rng.uniform(0, np.pi))
    r = np.sqrt((u / a) ** 2 + (v / b) ** 2)
    if wobble > 0:  # low harmonics of the outline make shapes less machine-perfect
        phi = np.arctan2(v, u)
        k2, k3 = rng.uniform(0, 2 * np.pi, 2)
        r = r / (1 + wobble * (np.cos(2 * phi + k2) + 0.7 * np.cos(3 * phi + k3)))
    return sl, dy, dx, r, sigmoid(1.0 - r, edge / a)


def _ellipse(rng, cv: Canvas, cy, cx, a, b, c_h, *, edge, grain, wobble) -> None:
    """A uniformly stained nucleus with mottled chromatin."""
    sl, _, _, _, mask = _ellipse_mask(rng, cv, cy, cx, a, b, edge=edge, wobble=wobble)
    cv.add_h(sl, c_h * mask * (1.0 + grain * cv.grain[sl]))
    cv.dim_e(sl, mask, 0.35)


def draw_nucleus(rng: np.random.Generator, cv: Canvas, cy: float, cx: float,
                  tumour: bool) -> None:
    """An ordinary nucleus: large pale (often vesicular) tumour nucleus or thin fibroblast."""
    if not tumour:
        a = rng.uniform(9, 18)
        _ellipse(rng, cv, cy, cx, a, a * rng.uniform(0.22, 0.4), rng.uniform(0.4, 0.7),
                 edge=1.2, grain=0.15, wobble=0.03)
        return
    a = rng.uniform(11, 22)
    c_h, grain = rng.uniform(0.35, 0.8), rng.uniform(0.15, 0.35)
    sl, dy, dx, r, mask = _ellipse_mask(rng, cv, cy, cx, a, a * rng.uniform(0.6, 1.0),
                                        edge=rng.uniform(1.0, 2.5),
                                        wobble=rng.uniform(0.0, 0.07))
    profile = np.ones_like(r)
    if rng.random() < 0.5:  # vesicular: chromatin pushed to the membrane, a nucleolus inside
        ny, nx = rng.uniform(-0.3, 0.3, 2) * a
        dot = np.exp(-((dy - ny) ** 2 + (dx - nx) ** 2) / (2 * rng.uniform(1.2, 2.2) ** 2))
        rim = np.exp(-(((r - 0.85) / 0.15) ** 2))
        # capped so nucleoli stay paler than mitotic chromatin, as in real nuclei
        profile = np.minimum(0.7 + 0.4 * rim + 0.5 * dot, 1.25)
    cv.add_h(sl, c_h * mask * profile * (1.0 + grain * cv.grain[sl]))
    cv.dim_e(sl, mask, 0.35)


def _segment_field(u, v, segs: np.ndarray, half_width: float) -> np.ndarray:
    """Signed inside-distance (px) to the union of thin segments ``segs`` (N, 4: u0 v0 u1 v1)."""
    u0, v0, u1, v1 = (segs[:, i, None, None] for i in range(4))
    du, dv = u1 - u0, v1 - v0
    t = np.clip(((u - u0) * du + (v - v0) * dv) / (du**2 + dv**2 + 1e-6), 0, 1)
    dist = np.sqrt((u - u0 - t * du) ** 2 + (v - v0 - t * dv) ** 2)
    return (half_width - dist).max(axis=0)


def _bar(rng, u, v, offset, half_len, half_w, bend) -> np.ndarray:
    """Inside-distance of a tapered, bent chromosome bar with hairs sticking out of it."""
    centre = offset + bend * u**2
    taper = half_w * (1 - 0.35 * (u / half_len) ** 2)
    field = np.minimum(taper - np.abs(v - centre), 0.6 * (half_len - np.abs(u)))
    n = int(rng.integers(5, 14))  # chromosome arms poking out of the plate
    su = rng.uniform(-half_len, half_len, n)
    side = rng.choice([-1.0, 1.0], n)
    sv = offset + bend * su**2 + side * half_w * 0.6
    ang = side * np.pi / 2 + rng.uniform(-0.7, 0.7, n)
    length = rng.uniform(2.5, 7.0, n)
    segs = np.stack([su, sv, su + length * np.cos(ang), sv + length * np.sin(ang)], axis=1)
    return np.maximum(field, _segment_field(u, v, segs, rng.uniform(0.7, 1.3)))


def draw_mitosis(rng: np.random.Generator, cv: Canvas, cy: int, cx: int) -> None:
    """A mitotic figure centred at (cy, cx), usually inside a pale clear halo."""
    sl, dy, dx = cv.window(cy, cx, 34)  # the largest figure plus its halo fits in here
    u, v = _rotate(dy, dx, rng.uniform(0, np.pi))
    kind = rng.choice(["metaphase", "anaphase", "prophase"], p=[0.5, 0.2, 0.3])
    if kind == "metaphase":  # equatorial plate seen side-on: one ragged bar
        half_len = rng.uniform(9, 19)
        field = _bar(rng, u, v, 0.0, half_len, rng.uniform(3.0, 5.5), rng.uniform(-0.02, 0.02))
        extent = half_len
    elif kind == "anaphase":  # two daughter sets pulling apart (telophase: further apart)
        half_len, gap = rng.uniform(7, 14), rng.uniform(4, 9)
        bend = rng.uniform(0.0, 0.03)
        fields = [_bar(rng, u, v, s * gap, half_len, rng.uniform(2.5, 4.2), s * bend)
                  for s in (-1.0, 1.0)]
        if rng.random() < 0.4:  # a lagging chromosome / chromatin bridge across the gap
            ub = rng.uniform(-3, 3)
            bridge = np.array([[ub, -gap, ub + rng.uniform(-2, 2), gap]])
            fields.append(_segment_field(u, v, bridge, rng.uniform(1.0, 1.6)))
        field = np.maximum.reduce(fields)
        extent = max(half_len, gap + 4)
    else:  # prophase / prometaphase: clumped chromatin, sometimes a hollow ring
        extent = rng.uniform(8, 14)
        n = int(rng.integers(8, 19))
        ring = rng.random() < 0.35
        rad = extent * (rng.uniform(0.55, 0.8, n) if ring else np.sqrt(rng.uniform(0, 0.7, n)))
        if not ring:
            rad[0] = 0.0  # a clump sits on the centre the annotator would click
        ang = rng.uniform(0, 2 * np.pi, n)
        pu, pv = rad * np.cos(ang), rad * np.sin(ang)
        d = np.sqrt((u - pu[:, None, None]) ** 2 + (v - pv[:, None, None]) ** 2)
        field = (rng.uniform(2.5, 4.0, n)[:, None, None] - d).max(axis=0)
        # threads of condensing chromatin join the clumps
        disk = extent * 0.95 - np.sqrt(u**2 + v**2)
        field = np.maximum(field, np.minimum(disk, 2.5 * (cv.grain[sl] - 0.6)))
    field = field + rng.uniform(0.6, 1.4) * cv.rag[sl]  # ragged, hairy outline
    mask = sigmoid(field, 0.6)

    r = np.sqrt(u**2 + v**2)
    if rng.random() < 0.65:  # retracted cytoplasm leaves a clear halo around the figure
        clear = sigmoid(extent + rng.uniform(4, 9) - r, 1.5)
        cv.ch[sl] *= 1 - 0.85 * clear
        cv.ce[sl] *= 1 - rng.uniform(0.35, 0.65) * clear
    else:  # rounded-up cell with faint pink cytoplasm instead
        cell = sigmoid(extent + rng.uniform(4, 8) - r, 1.5)
        np.maximum(cv.ce[sl], rng.uniform(0.3, 0.45) * cell, out=cv.ce[sl])
    cv.add_h(sl, rng.uniform(1.2, 1.9) * mask * (0.9 + 0.1 * cv.grain[sl]))
    cv.dim_e(sl, mask, 0.7)


def draw_lookalike(rng: np.random.Generator, cv: Canvas, cy: float, cx: float,
                    mitoses: np.ndarray) -> list[tuple[float, float]]:
    """A non-mitotic dark nucleus (group members keep 30 px off ``mitoses``); its centres."""
    kind = rng.choice(["hyperchromatic", "apoptotic", "lymphocytes"], p=[0.45, 0.25, 0.30])
    if kind == "hyperchromatic":  # dark but smooth-edged, evenly stained interphase nucleus
        a = rng.uniform(10, 18)
        _ellipse(rng, cv, cy, cx, a, a * rng.uniform(0.5, 1.0), rng.uniform(0.9, 1.3),
                 edge=rng.uniform(0.8, 1.5), grain=rng.uniform(0.05, 0.2),
                 wobble=rng.uniform(0.0, 0.1))
        return [(cy, cx)]
    if kind == "apoptotic":  # shrunken pink cell holding one or a few dense round beads
        sl, dy, dx = cv.window(cy, cx, 16)
        r = np.sqrt(dy**2 + dx**2)
        body = sigmoid(rng.uniform(7, 11) - r, 1.0)
        np.maximum(cv.ce[sl], rng.uniform(0.55, 0.85) * body, out=cv.ce[sl])
        if rng.random() < 0.5:
            ring = sigmoid(r - rng.uniform(9, 12), 1.0) * sigmoid(rng.uniform(14, 17) - r, 1.0)
            cv.ch[sl] *= 1 - 0.85 * ring  # a clear halo, like many mitoses have
            cv.ce[sl] *= 1 - 0.5 * ring
        beads = 1 if rng.random() < 0.55 else int(rng.integers(2, 5))
        for _ in range(beads):
            by, bx = (rng.uniform(-4, 4, 2) if beads > 1 else (0.0, 0.0))
            rad = rng.uniform(4, 7) if beads == 1 else rng.uniform(2.2, 4)
            _ellipse(rng, cv, cy + by, cx + bx, rad, rad * rng.uniform(0.85, 1.0),
                     rng.uniform(1.1, 1.7), edge=0.6, grain=0.04, wobble=0.0)
        return [(cy, cx)]
    centres = [(cy, cx)]  # lymphocytes: small, round, dark, often in little groups
    for _ in range(int(rng.integers(0, 4))):
        ang, dist = rng.uniform(0, 2 * np.pi), rng.uniform(13, 20)
        y, x = centres[-1][0] + dist * math.sin(ang), centres[-1][1] + dist * math.cos(ang)
        clear = not len(mitoses) or np.hypot(*(mitoses - (y, x)).T).min() >= 30
        if 0 <= y < cv.shape[0] and 0 <= x < cv.shape[1] and clear:
            centres.append((y, x))
    for y, x in centres:
        rad = rng.uniform(5, 8)
        _ellipse(rng, cv, y, x, rad, rad * rng.uniform(0.85, 1.0), rng.uniform(0.85, 1.2),
                 edge=0.8, grain=0.1, wobble=0.02)
    return centres


def place(rng, tissue, count, min_dist, avoid, avoid_dist) -> np.ndarray:
    """Up to ``count`` integer tissue points ``min_dist`` apart and ``avoid_dist`` from
    ``avoid`` (rejection sampling; points that find no room are dropped)."""
    size = tissue.shape[0]
    chosen: list[np.ndarray] = []
    for cand in rng.integers(BORDER, size - BORDER, size=(count * 30, 2)):
        if len(chosen) == count:
            break
        if tissue[cand[0], cand[1]] < 0.6:
            continue
        pts = np.asarray(chosen + list(avoid), dtype=np.float64).reshape(-1, 2)
        if len(pts):
            d = np.hypot(*(pts - cand).T)
            if (d[: len(chosen)] < min_dist).any() or (d[len(chosen):] < avoid_dist).any():
                continue
        chosen.append(cand)
    return np.asarray(chosen, dtype=np.int64).reshape(-1, 2)
