"""Synthetic MNIST, Fashion-MNIST and affNIST files in the official formats.

The real files cannot be downloaded on the development machines, so tests and demos
run the real readers on images drawn here:

* digits: a character drawn by ``cv2.putText`` (one of eight Hershey fonts, random
  scale, stroke width, slant and rotation), then normalised the way MNIST was: fitted
  into a 20x20 box with its aspect kept, and centred by centre of mass in 28x28;
* fashion: a filled silhouette per Fashion-MNIST class (T-shirt, trouser, pullover,
  dress, coat, sandal, shirt, sneaker, bag, ankle boot) with random proportions, grey
  level, cloth texture and position;
* affNIST: digits padded to 40x40 and warped by a random affine map in affNIST's
  ranges (rotation +-20 deg, shear +-45 deg, scale 0.8-1.2 per axis, translation up to
  8 px that keeps the digit inside the frame), saved as MATLAB ``.mat`` files.

Everything is white-on-black uint8, as in the real data, and a pure function of the
seed. :func:`write_mnist_like` writes the four IDX files under their official names;
:func:`write_affnist` writes ``test.mat`` and ``test_batches/<k>.mat`` (MATLAB v5 as
distributed, or v7.3/HDF5 to exercise that reader path).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import h5py
import numpy as np
import scipy.io

from capsmed.data.sources.mnist.idx import write_idx
from capsmed.data.sources.mnist.reader import IDX_FILES
from capsmed.errors import CapsmedError
from capsmed.io import atomic_dir, atomic_path
from capsmed.progress import track

log = logging.getLogger(__name__)

_FONTS = (cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_PLAIN, cv2.FONT_HERSHEY_DUPLEX,
          cv2.FONT_HERSHEY_COMPLEX, cv2.FONT_HERSHEY_TRIPLEX, cv2.FONT_HERSHEY_COMPLEX_SMALL,
          cv2.FONT_HERSHEY_SCRIPT_SIMPLEX, cv2.FONT_HERSHEY_SCRIPT_COMPLEX)
_WORK = 64  # drawing canvas side; the glyph is reduced to MNIST's 20x20 box afterwards


def _warp(image: np.ndarray, angle: float, shear: float) -> np.ndarray:
    """Rotate by ``angle`` degrees and shear by ``shear`` (x += shear * y) about the centre."""
    h, w = image.shape
    c = np.array([w / 2, h / 2])
    a = math.radians(angle)
    rot = np.array([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]])
    m = rot @ np.array([[1.0, shear], [0.0, 1.0]])
    affine = np.hstack([m, (c - m @ c)[:, None]])
    return cv2.warpAffine(image, affine, (w, h), flags=cv2.INTER_LINEAR)


def normalise_like_mnist(glyph: np.ndarray, rng: np.random.Generator,
                         box: int = 20, size: int = 28) -> np.ndarray:
    """Fit ``glyph`` into a ``box`` square (aspect kept) and centre it by mass in ``size``."""
    ys, xs = np.nonzero(glyph > 8)
    if len(ys) == 0:
        return np.zeros((size, size), np.uint8)
    crop = glyph[ys.min():ys.max() + 1, xs.min():xs.max() + 1].astype(np.float32)
    scale = box / max(crop.shape)
    h = max(1, round(crop.shape[0] * scale))
    w = max(1, round(crop.shape[1] * scale))
    small = cv2.resize(crop, (w, h), interpolation=cv2.INTER_AREA)
    mass = small.sum()
    cy = (small.sum(axis=1) @ np.arange(h)) / mass
    cx = (small.sum(axis=0) @ np.arange(w)) / mass
    # Centre of mass at the image centre (MNIST's rule), +-1 px of wobble, kept inside.
    top = int(np.clip(round(size / 2 - cy + rng.integers(-1, 2)), 0, size - h))
    left = int(np.clip(round(size / 2 - cx + rng.integers(-1, 2)), 0, size - w))
    out = np.zeros((size, size), np.float32)
    out[top:top + h, left:left + w] = small
    peak = out.max()
    return np.clip(np.rint(out * (rng.uniform(220, 255) / peak)), 0, 255).astype(np.uint8)


def render_digit(rng: np.random.Generator, digit: int) -> np.ndarray:
    """One synthetic handwritten-like digit, uint8 28x28, white on black."""
    canvas = np.zeros((_WORK, _WORK), np.uint8)
    font = _FONTS[rng.integers(len(_FONTS))]
    scale = rng.uniform(1.3, 2.0)
    thickness = int(rng.integers(2, 6))
    text = str(int(digit))
    (tw, th), _ = cv2.getTextSize(text, font, scale, thickness)
    origin = ((_WORK - tw) // 2, (_WORK + th) // 2)
    cv2.putText(canvas, text, origin, font, scale, 255, thickness, cv2.LINE_AA)
    glyph = _warp(canvas, rng.uniform(-15, 15), rng.uniform(-0.3, 0.3))
    return normalise_like_mnist(glyph, rng)


Point = tuple[float, float]


def _torso(x0: float, x1: float, y0: float, y1: float) -> list[Point]:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def _sleeves(x0: float, x1: float, y0: float, length: float, drop: float
             ) -> list[list[Point]]:
    """Left and right sleeve polygons hanging from shoulders at (x0, y0) and (x1, y0)."""
    left = [(x0, y0), (x0 - drop, y0 + length), (x0 - drop + 7, y0 + length + 3), (x0, y0 + 12)]
    right = [(x1 + (x0 - x), y) for x, y in left]
    return [left, right]


def _fashion_shapes(cls: int, rng: np.random.Generator) -> tuple[list, list, list]:
    """(filled polygons, dark lines, dark dots) of one item on a 56x56 canvas."""
    def j(lo: float, hi: float) -> float:  # a jittered proportion
        return float(rng.uniform(lo, hi))

    w, top, bottom = j(11, 14), j(8, 12), j(48, 53)
    x0, x1 = 28 - w, 28 + w
    polys: list = []
    lines: list = []
    dots: list = []
    if cls in (0, 2, 4, 6):  # tops: torso plus sleeves
        long_sleeves = cls != 0
        length = j(30, 36) if long_sleeves else j(8, 12)
        polys += [_torso(x0, x1, top, bottom)]
        polys += _sleeves(x0, x1, top, length, j(8, 11) if long_sleeves else j(7, 10))
        lines.append([(28 - 4, top), (28, top + j(3, 6)), (28 + 4, top)])  # neckline
        if cls == 4:  # coat: a front opening and lapels, a bit longer
            polys[0] = _torso(x0 - 1, x1 + 1, top, min(55, bottom + 3))
            lines.append([(28, top + 4), (28, min(55, bottom + 3))])
            lines.append([(28 - 6, top), (28, top + 12), (28 + 6, top)])
        if cls == 6:  # shirt: collar, button placket and a check pattern
            lines.append([(28, top + 4), (28, bottom)])
            dots += [(28.0 + 2.5, top + 8 + 7 * k) for k in range(5)]
            lines += [[(x0, y), (x1, y)] for y in np.arange(top + 6, bottom, j(6, 9))]
    elif cls == 1:  # trousers: waistband and two legs with a gap
        gap = j(1.5, 3)
        polys += [_torso(x0 + 2, x1 - 2, 2, 9),
                  [(x0 + 2, 9), (28 - gap, 9), (28 - gap - 1, 55), (x0 + 1, 55)],
                  [(28 + gap, 9), (x1 - 2, 9), (x1 - 1, 55), (28 + gap + 1, 55)]]
    elif cls == 3:  # dress: narrow bodice widening to a hem
        waist, hem = j(6, 9), j(17, 23)
        polys += [[(28 - waist, 4), (28 + waist, 4), (28 + waist - 1, 20), (28 + hem, 54),
                   (28 - hem, 54), (28 - waist + 1, 20)]]
        lines.append([(28 - waist, 20), (28 + waist, 20)])
    elif cls == 5:  # sandal: a sole and a few thin straps
        y = j(36, 42)
        polys += [[(3, y), (53, y - 2), (53, y + 5), (3, y + 6)]]
        for k in range(int(rng.integers(3, 5))):
            xs = 8 + k * j(10, 13)
            polys.append([(xs, y), (xs + 3, y), (xs + 9, y - j(12, 18)), (xs + 6, y - 18)])
    elif cls == 7:  # sneaker: low upper over a thick sole, laces
        y = j(38, 42)
        polys += [[(3, y), (53, y), (53, y + 6), (3, y + 6)],
                  [(4, y), (8, y - j(12, 16)), (24, y - j(17, 21)), (40, y - 8), (53, y - 4),
                   (53, y)]]
        lines += [[(14 + 4 * k, y - 14), (18 + 4 * k, y - 10)] for k in range(4)]
    elif cls == 8:  # bag: a body and a handle loop
        bw, top_y = j(18, 23), j(20, 26)
        polys += [_torso(28 - bw, 28 + bw, top_y, 52)]
        lines.append([(28 - 9, top_y), (28 - 7, top_y - 12), (28 + 7, top_y - 12),
                      (28 + 9, top_y)])
    else:  # ankle boot: a shaft, a foot and a heel
        y = j(46, 50)
        polys += [[(12, 6), (30, 6), (31, y - 14), (50, y - 8), (53, y), (12, y)],
                  [(12, y), (20, y), (20, y + 5), (12, y + 5)], [(20, y), (53, y),
                                                               (53, y + 3), (20, y + 3)]]
    return polys, lines, dots


def render_fashion(rng: np.random.Generator, cls: int) -> np.ndarray:
    """One synthetic Fashion-MNIST-like item of class ``cls``, uint8 28x28."""
    polys, lines, dots = _fashion_shapes(int(cls), rng)
    size = 56
    s, dy, dx = rng.uniform(0.88, 1.05), rng.uniform(-2.5, 2.5), rng.uniform(-2.5, 2.5)

    def pts(poly):
        p = (np.asarray(poly, np.float64) - 28) * s + 28 + [dx, dy]
        return np.rint(p * 16).astype(np.int32)  # 4 fractional bits for smooth edges

    mask = np.zeros((size, size), np.uint8)
    cv2.fillPoly(mask, [pts(p) for p in polys], 255, cv2.LINE_AA, shift=4)
    detail = np.zeros_like(mask)
    for line in lines:
        cv2.polylines(detail, [pts(line)], False, 255, 1, cv2.LINE_AA, shift=4)
    for x, y in dots:
        cx, cy = pts([(x, y)])[0]
        cv2.circle(detail, (int(cx), int(cy)), 16, 255, -1, cv2.LINE_AA, shift=4)
    texture = cv2.GaussianBlur(rng.standard_normal((size, size)).astype(np.float32), (0, 0), 2)
    base = rng.uniform(110, 230)
    grey = (mask / 255.0) * (base * (1 + 0.12 * texture) - 0.45 * base * (detail / 255.0))
    small = cv2.resize(grey.astype(np.float32), (28, 28), interpolation=cv2.INTER_AREA)
    return np.clip(np.rint(small), 0, 255).astype(np.uint8)


def render_images(kind: str, labels: np.ndarray, seed: int, stream: int,
                  disable_progress: bool | None = None) -> np.ndarray:
    """Render one image per label: uint8 [N, 28, 28] (``kind``: mnist or fashion-mnist).

    Image ``i`` comes from ``default_rng([seed, stream, i])``, so an image does not
    depend on how many others are drawn.
    """
    draw = render_digit if kind == "mnist" else render_fashion
    out = np.empty((len(labels), 28, 28), np.uint8)
    items = track(list(enumerate(labels.tolist())), f"Drawing {kind}",
                  disable=disable_progress)
    for i, label in items:  # cv2 drawing works one image at a time
        out[i] = draw(np.random.default_rng([seed, stream, i]), label)
    return out


def random_affine(rng: np.random.Generator, size: int = 40) -> np.ndarray:
    """A 2x3 affine matrix in affNIST's ranges, about the centre, without translation."""
    a = math.radians(rng.uniform(-20, 20))
    shear = math.tan(math.radians(rng.uniform(-45, 45)))
    sx, sy = rng.uniform(0.8, 1.2, 2)
    m = (np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
         @ np.array([[1.0, shear], [0.0, 1.0]]) @ np.diag([sx, sy]))
    c = np.array([(size - 1) / 2, (size - 1) / 2])
    return np.hstack([m, (c - m @ c)[:, None]])


def affnist_like(images28: np.ndarray, rng: np.random.Generator,
                 max_shift: float = 8.0) -> np.ndarray:
    """Pad 28x28 digits to 40x40 and warp each by a random affNIST-range affine map.

    The translation is drawn within +-``max_shift`` px per axis, narrowed so that the
    transformed digit stays inside the 40x40 frame (affNIST keeps digits whole).
    """
    out = np.empty((len(images28), 40, 40), np.uint8)
    for i, digit in enumerate(images28):
        padded = np.pad(digit, 6)
        affine = random_affine(rng)
        ys, xs = np.nonzero(padded)
        if len(ys):
            corners = affine[:, :2] @ np.stack([xs, ys]) + affine[:, 2:]
            lo = np.maximum(-max_shift, -corners.min(axis=1))
            hi = np.minimum(max_shift, 39 - corners.max(axis=1))
            shift = np.where(lo <= hi, rng.uniform(np.minimum(lo, hi), np.maximum(lo, hi)),
                             (lo + hi) / 2)
            affine[:, 2] += shift
        out[i] = cv2.warpAffine(padded, affine, (40, 40), flags=cv2.INTER_LINEAR)
    return out


# --------------------------------------------------------------------------- writers


@dataclass(frozen=True)
class SynthDigitsSummary:
    """What a synthetic writer produced: its folder, files and image counts."""

    root: Path
    files: tuple[Path, ...]
    counts: dict[str, int]


def balanced_labels(n: int, rng: np.random.Generator, classes: int = 10) -> np.ndarray:
    """``n`` labels with every class equally often (+-1), in random order."""
    return rng.permutation(np.arange(n) % classes).astype(np.uint8)


def write_mnist_like(out_dir: Path, kind: str = "mnist", *, train: int = 600, test: int = 100,
                     seed: int = 0, compress: bool = True,
                     disable_progress: bool | None = None) -> SynthDigitsSummary:
    """Write synthetic MNIST or Fashion-MNIST IDX files under the official names.

    Args:
        out_dir: Folder to create (must not exist or be empty).
        kind: ``"mnist"`` (digits) or ``"fashion-mnist"`` (clothing silhouettes).
        train: Number of training images (``train-*`` files).
        test: Number of test images (``t10k-*`` files).
        seed: Same seed, same bytes.
        compress: Write ``.gz`` files as distributed (False: plain IDX).
        disable_progress: Hide the progress bar.
    """
    out_dir = Path(out_dir)
    if kind not in ("mnist", "fashion-mnist"):
        raise CapsmedError(f"{out_dir}: unknown kind {kind!r} (use mnist or fashion-mnist)")
    if train < 1 or test < 1 or seed < 0:
        raise CapsmedError(f"{out_dir}: need --train >= 1, --test >= 1 and --seed >= 0")
    suffix = ".gz" if compress else ""
    written = []
    with atomic_dir(out_dir) as tmp:
        for stream, (prefix, n) in enumerate((("train", train), ("t10k", test))):
            labels = balanced_labels(n, np.random.default_rng([seed, 100 + stream]))
            images = render_images(kind, labels, seed, stream, disable_progress)
            image_name, label_name = IDX_FILES[prefix]
            write_idx(tmp / f"{image_name}{suffix}", images)
            write_idx(tmp / f"{label_name}{suffix}", labels)
            written += [out_dir / f"{image_name}{suffix}", out_dir / f"{label_name}{suffix}"]
    log.info("wrote synthetic %s (%d train, %d test images) to %s", kind, train, test, out_dir)
    return SynthDigitsSummary(out_dir, tuple(written), {"train": train, "t10k": test})


def write_fashion_mnist(out_dir: Path, **options: Any) -> SynthDigitsSummary:
    """:func:`write_mnist_like` for Fashion-MNIST (the source registry's hook)."""
    return write_mnist_like(out_dir, "fashion-mnist", **options)


def write_affnist_mat(path: Path, images: np.ndarray, labels: np.ndarray,
                      version: str = "5") -> Path:
    """Write 40x40 images and labels as an affNIST ``.mat`` file (atomically).

    The struct ``affNISTdata`` holds ``image`` (uint8 1600 x N, one image per column),
    ``label_int`` (uint8 1 x N) and ``label_one_of_n`` (uint8 10 x N). Each column
    holds its image's rows one after another (row-major), as in the real files, so
    MATLAB's column-major ``reshape(image(:, n), 40, 40)`` shows the digit transposed.

    Args:
        path: The ``.mat`` file.
        images: uint8 [N, 40, 40], upright.
        labels: [N] integers 0-9.
        version: ``"5"`` (what affNIST distributes; scipy ``savemat``) or ``"7.3"``
            (MATLAB's HDF5-based format, written with h5py).
    """
    images = np.asarray(images, np.uint8)
    labels = np.asarray(labels).astype(np.uint8).reshape(-1)
    n = len(images)
    columns = images.reshape(n, -1).T  # [1600, N]: column k is image k, rows in order
    one_hot = np.zeros((10, n), np.uint8)
    one_hot[labels, np.arange(n)] = 1
    with atomic_path(Path(path)) as tmp:
        if version == "5":
            with tmp.open("wb") as fh:
                scipy.io.savemat(fh, {"affNISTdata": {
                    "image": columns, "label_int": labels[None, :],
                    "label_one_of_n": one_hot}}, do_compression=True)
        elif version == "7.3":
            _write_mat73(tmp, {"image": columns, "label_int": labels[None, :],
                               "label_one_of_n": one_hot})
        else:
            raise ValueError(f"unknown MAT-file version {version!r} (use '5' or '7.3')")
    return Path(path)


def _write_mat73(path: Path, fields: dict[str, np.ndarray]) -> None:
    """A MATLAB v7.3 file: HDF5 behind a 512-byte MATLAB header, arrays stored transposed.

    MATLAB writes column-major arrays, so HDF5 (row-major) sees every array with its
    dimensions reversed: the 1600 x N ``image`` is an N x 1600 dataset.
    """
    with h5py.File(path, "w", userblock_size=512) as f:
        struct = f.create_group("affNISTdata")
        struct.attrs["MATLAB_class"] = np.bytes_(b"struct")
        for name, value in fields.items():
            ds = struct.create_dataset(name, data=np.ascontiguousarray(value.T))
            ds.attrs["MATLAB_class"] = np.bytes_(b"uint8")
    text = b"MATLAB 7.3 MAT-file, Platform: capsmed synthetic, HDF5 schema 1.00 ."
    header = text.ljust(116, b" ") + b"\x00" * 8 + b"\x00\x02" + b"IM"
    with path.open("r+b") as fh:
        fh.write(header.ljust(512, b"\x00"))


def write_affnist(out_dir: Path, *, count: int = 200, batches: int = 4, seed: int = 0,
                  version: str = "5", disable_progress: bool | None = None
                  ) -> SynthDigitsSummary:
    """Write a synthetic affNIST test set in both distributed layouts.

    ``out_dir/test.mat`` holds all ``count`` images and ``out_dir/test_batches/1.mat``
    .. ``<batches>.mat`` hold the same images split into consecutive batches, as in
    the official ``test.mat.zip`` and ``test_batches.zip``.
    """
    out_dir = Path(out_dir)
    if count < 1 or not 1 <= batches <= count or seed < 0:
        raise CapsmedError(f"{out_dir}: need count >= 1, 1 <= batches <= count, seed >= 0")
    rng = np.random.default_rng([seed, 7])
    labels = balanced_labels(count, rng)
    images = affnist_like(render_images("mnist", labels, seed, 7, disable_progress), rng)
    files = [out_dir / "test.mat"]
    with atomic_dir(out_dir) as tmp:
        write_affnist_mat(tmp / "test.mat", images, labels, version)
        (tmp / "test_batches").mkdir()
        for k, part in enumerate(np.array_split(np.arange(count), batches), start=1):
            write_affnist_mat(tmp / "test_batches" / f"{k}.mat", images[part], labels[part],
                              version)
            files.append(out_dir / "test_batches" / f"{k}.mat")
    log.info("wrote synthetic affNIST (%d images, %d batches) to %s", count, batches, out_dir)
    return SynthDigitsSummary(out_dir, tuple(files), {"test": count})
