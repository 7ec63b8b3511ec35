"""Stain normalisation of RGB histology against a target: Macenko and Reinhard.

Two scanners, or two labs' staining, give the same tissue other colours. Both methods
map an image's colours onto a target's (what TIAToolbox and HistomicsTK offer):

* **Macenko** (Macenko et al., ISBI 2009): in optical density (OD = -ln((I + 1) /
  256)), the stained pixels (OD above ``BETA`` in every channel) lie near the plane of
  the two largest eigenvectors of their covariance; the directions at the 1st and
  99th percentile of their angle in that plane are the two stain vectors (hematoxylin
  the one absorbing more red). Each pixel's two concentrations are its OD solved on
  those vectors; they are scaled so that their 99th percentiles match the target's,
  and recombined with the target's stain vectors.
* **Reinhard** (Reinhard et al., 2001): each channel of the image in CIELAB (OpenCV's
  float conversion) is shifted and scaled to the target's mean and standard deviation.

A target is fitted once, from a reference image or read from a JSON file of its
statistics; the dataset file records the numbers (:meth:`StainNormaliser.to_record`),
so ``capsmed predict`` replays the normalisation without the reference image. The
statistics of the image being normalised are estimated from that image alone, as
TIAToolbox's ``transform`` does; an image with one stain only keeps the target's stain
vectors as its own, so only its concentrations are rescaled. An image of glass (fewer
than ``MIN_STAINED`` pixels with an OD above ``BETA`` in some channel: its noise,
scaled to the target's stain or contrast, became tissue) is left as it is by both
methods, and so is a blank one (CIELAB lightness std below ``MIN_LAB_STD``) by
Reinhard, which shifts but does not scale a channel whose std is below
``MIN_LAB_STD`` (a grey image's a and b are rounding noise). A target is refused
when it is mostly background (Macenko: a 99th-percentile concentration below
``MIN_TARGET_CONCENTRATION``), and a Reinhard target when it is glass, blank or
colourless (a std below ``MIN_LAB_STD``); a transparent target's pixels count as
white.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from capsmed.errors import CapsmedError

BETA = 0.15  # OD below this in any channel: glass or very faint, left out of the fit
ANGLE_PERCENTILE = 1.0  # Macenko's robust extremes: the 1st and 99th percentile angles
MAX_PERCENTILE = 99.0  # a stain's "maximum" concentration
MIN_STAINED = 16  # stained pixels needed to estimate an image's own stain vectors
MIN_STAIN_ANGLE = 0.05  # radians between the two vectors; closer is one stain only
# a target's 99th-percentile concentration below this: mostly glass or background, whose
# "maximum" would fade every normalised image to white (H&E tissue gives about 0.5-2)
MIN_TARGET_CONCENTRATION = 0.2
# a CIELAB channel std below this is flat: L blank (Reinhard leaves the image), a or b
# colourless (rounding noise, shifted but never scaled up to the target's std)
MIN_LAB_STD = 0.5
FIT_PIXELS = 1 << 18  # stained pixels the vectors are fitted on (a fixed stride beyond)
_OD = -np.log((np.arange(256, dtype=np.float64) + 1.0) / 256.0)  # OD of each 8-bit value
RECORD_KEYS = {"macenko": ("stain_matrix", "max_concentrations"),
               "reinhard": ("lab_means", "lab_stds")}


def optical_density(rgb: np.ndarray, dtype: type = np.float64) -> np.ndarray:
    """OD [N, 3] of an (H, W, 3) uint8 image's pixels, ``-ln((I + 1) / 256)``."""
    return _OD.astype(dtype)[np.asarray(rgb, dtype=np.uint8).reshape(-1, 3)]


def tissue_pixels(rgb: np.ndarray) -> int:
    """How many pixels are darker than glass: an OD above ``BETA`` in some channel (a
    pale eosin pixel absorbs green only)."""
    return int((optical_density(rgb, np.float32) > BETA).any(axis=1).sum())


def estimate_stain_matrix(rgb: np.ndarray) -> np.ndarray | None:
    """Macenko's two unit stain vectors in OD space, float64 [2, 3] (hematoxylin
    first), or None when the image holds too little stain, or one stain only."""
    od = optical_density(rgb)
    stained = od[(od > BETA).all(axis=1)]
    if len(stained) < MIN_STAINED:
        return None
    stained = stained[::-(-len(stained) // FIT_PIXELS)]  # deterministic, ~FIT_PIXELS
    _, vectors = np.linalg.eigh(np.cov(stained, rowvar=False))
    plane = vectors[:, [2, 1]]  # the two largest eigenvectors span the stain plane
    plane[:, 0] *= np.sign(plane[:, 0].sum()) or 1.0  # point it into positive OD
    projected = stained @ plane
    angle = np.arctan2(projected[:, 1], projected[:, 0])
    low, high = np.percentile(angle, [ANGLE_PERCENTILE, 100 - ANGLE_PERCENTILE])
    if high - low < MIN_STAIN_ANGLE:
        return None
    first = plane @ np.array([np.cos(low), np.sin(low)])
    second = plane @ np.array([np.cos(high), np.sin(high)])
    # into positive OD first, then hematoxylin (more red) first: ordering before the
    # flip took a negated vector's red for the stain's own
    first, second = (v * (np.sign(v.sum()) or 1.0) for v in (first, second))
    stains = np.stack([first, second] if first[0] >= second[0] else [second, first])
    return stains / np.linalg.norm(stains, axis=1, keepdims=True)


def stain_concentrations(rgb: np.ndarray, stains: np.ndarray) -> np.ndarray:
    """Least-squares concentrations float64 [N, 2] of the pixels on ``stains`` [2, 3]."""
    return optical_density(rgb) @ np.linalg.pinv(stains.T).T


def lab_image(rgb: np.ndarray) -> np.ndarray:
    """CIELAB float32 (L 0-100) of an (H, W, 3) uint8 RGB image (OpenCV's conversion)."""
    return cv2.cvtColor(np.ascontiguousarray(rgb, dtype=np.float32) / 255.0,
                        cv2.COLOR_RGB2LAB)


# CIELAB's range over every 8-bit RGB colour (its extremes are the RGB cube's corners):
# L 0..100, a about -86..98, b about -108..94; OpenCV's 8-bit LAB (L 0..255, a and b
# offset by 128) lies outside it
_CORNERS = lab_image(np.array([[[r, g, b] for r in (0, 255) for g in (0, 255)
                                for b in (0, 255)]], np.uint8)).reshape(-1, 3)
LAB_LOW, LAB_HIGH = _CORNERS.min(axis=0) - 0.5, _CORNERS.max(axis=0) + 0.5


def lab_statistics(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation float64 [3] of each CIELAB channel."""
    lab = lab_image(rgb).reshape(-1, 3).astype(np.float64)
    return lab.mean(axis=0), lab.std(axis=0)


def _rgb8(rgb: np.ndarray) -> np.ndarray:
    """The RGB channels of an (H, W, 3 or 4) uint8 image, contiguous; anything else is
    refused (a cast would wrap 16-bit values and zero a float image's 0..1)."""
    rgb = np.asarray(rgb)
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[-1] < 3:
        raise ValueError(f"stain normalisation needs an (H, W, 3) uint8 RGB image, got "
                         f"{rgb.dtype} of shape {list(rgb.shape)}")
    return np.ascontiguousarray(rgb[..., :3])


def _to_uint8(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return np.clip(np.rint(values), 0, 255).astype(np.uint8).reshape(shape)


@dataclass(frozen=True)
class StainNormaliser:
    """A normalisation method with its fitted target statistics.

    Attributes:
        method: ``macenko`` or ``reinhard``.
        target: Macenko: ``stain_matrix`` [2][3] (unit rows, hematoxylin first) and
            ``max_concentrations`` [2]; Reinhard: ``lab_means`` [3], ``lab_stds`` [3].
        origin: Where the target came from (file name and digest), for the record.
    """

    method: str
    target: dict[str, tuple]
    origin: dict[str, str]

    def apply(self, rgb: np.ndarray) -> np.ndarray:
        """``rgb`` (H, W, 3) uint8 normalised to the target: uint8 of the same shape."""
        rgb = _rgb8(rgb)
        if tissue_pixels(rgb) < MIN_STAINED:  # glass: no stain to map, and its noise
            return rgb                          # scaled to the target's became tissue
        if self.method == "reinhard":
            means, stds = lab_statistics(rgb)
            if stds[0] < MIN_LAB_STD:  # blank (padding, one colour): no colours to map,
                return rgb             # and its mean would turn it into tissue
            # a flat channel (a grey image's a and b) is shifted, not its noise scaled
            scale = np.where(stds < MIN_LAB_STD, 1.0,
                             np.asarray(self.target["lab_stds"]) / np.maximum(stds, 1e-6))
            lab = (lab_image(rgb) - means) * scale + np.asarray(self.target["lab_means"])
            back = cv2.cvtColor(lab.astype(np.float32), cv2.COLOR_LAB2RGB)
            return _to_uint8(back * 255.0, rgb.shape)
        target = np.asarray(self.target["stain_matrix"])
        own = estimate_stain_matrix(rgb)
        unmix = np.linalg.pinv((target if own is None else own).T).T  # OD -> concentrations
        od = optical_density(rgb, np.float32)
        peak = np.percentile(od @ unmix.astype(np.float32), MAX_PERCENTILE, axis=0)
        # an image with (almost) no stain keeps its concentrations as they are
        scale = np.where(peak > 1e-3, np.asarray(self.target["max_concentrations"]) /
                         np.maximum(peak, 1e-3), 1.0)
        # unmix, rescale, remix with the target's vectors: one 3x3 map of OD
        remix = ((unmix * scale) @ target).astype(np.float32)
        return _to_uint8(256.0 * np.exp(-(od @ remix)) - 1.0, rgb.shape)

    def to_record(self) -> dict[str, Any]:
        """The JSON the dataset file records (and :meth:`from_record` reads back)."""
        return {"method": self.method,
                **{k: np.asarray(v).tolist() for k, v in self.target.items()},
                **self.origin}

    @classmethod
    def fit(cls, method: str, rgb: np.ndarray, origin: dict[str, str] | None = None
            ) -> StainNormaliser:
        """Fit ``method``'s target statistics on the reference image ``rgb``.

        Raises:
            CapsmedError: Macenko on an image whose stain vectors cannot be estimated.
        """
        origin = origin or {}
        rgb = _rgb8(rgb)
        if method == "reinhard":
            means, stds = lab_statistics(rgb)
            name = origin.get("target", "the target image")
            if tissue_pixels(rgb) < MIN_STAINED or stds.min() < MIN_LAB_STD:
                # every image normalised to it came out blank (white) or colourless
                raise CapsmedError(f"{name}: its CIELAB stds are {stds[0]:.3f}, "
                                   f"{stds[1]:.3f} and {stds[2]:.3f} with "
                                   f"{tissue_pixels(rgb)} pixels darker than glass: a blank, "
                                   "glass-only or colourless image would make every "
                                   "normalised image so; choose a target that is "
                                   "mostly tissue")
            return cls(method, {"lab_means": tuple(means), "lab_stds": tuple(stds)}, origin)
        if method != "macenko":
            raise CapsmedError(f"unknown stain normalisation {method!r} (macenko, reinhard)")
        stains = estimate_stain_matrix(rgb)
        if stains is None:
            raise CapsmedError(f"{origin.get('target', 'the target image')}: too little "
                               "stain (or one stain only) to estimate its stain vectors; "
                               "choose a target with both stains")
        peak = np.percentile(stain_concentrations(rgb, stains), MAX_PERCENTILE, axis=0)
        if peak.min() < MIN_TARGET_CONCENTRATION:
            raise CapsmedError(f"{origin.get('target', 'the target image')}: its stains' "
                               f"99th-percentile concentrations are {peak[0]:.3f} and "
                               f"{peak[1]:.3f}, too low: the image is mostly background "
                               "and would fade every normalised image; choose a target "
                               "that is mostly tissue")
        return cls(method, {"stain_matrix": tuple(map(tuple, stains)),
                            "max_concentrations": tuple(peak)}, origin)

    @classmethod
    def from_record(cls, record: dict[str, Any], where: object = "stain target"
                    ) -> StainNormaliser:
        """The normaliser a record (or a target JSON file) describes, checked.

        Raises:
            CapsmedError: naming ``where`` and what is missing or malformed.
        """
        method = record.get("method") if isinstance(record, dict) else None
        if method not in RECORD_KEYS:
            raise CapsmedError(f"{where}: 'method' must be macenko or reinhard, got "
                               f"{method!r}")
        shapes = {"stain_matrix": (2, 3), "max_concentrations": (2,), "lab_means": (3,),
                  "lab_stds": (3,)}
        target = {}
        for key in RECORD_KEYS[method]:
            try:
                value = np.asarray(record[key], dtype=np.float64)
            except (KeyError, TypeError, ValueError):
                raise CapsmedError(f"{where}: {method} needs '{key}' as numbers "
                                   f"{list(shapes[key])}") from None
            if value.shape != shapes[key] or not np.isfinite(value).all():
                raise CapsmedError(f"{where}: '{key}' must be {list(shapes[key])} finite "
                                   f"numbers, got {value.tolist()}")
            target[key] = tuple(map(tuple, value)) if value.ndim == 2 else tuple(value)
        if method == "macenko" and not np.allclose(
                np.linalg.norm(target["stain_matrix"], axis=1), 1.0, atol=1e-6):
            raise CapsmedError(f"{where}: the rows of 'stain_matrix' must be unit vectors")
        if method == "macenko":
            rows = np.asarray(target["stain_matrix"])
            if (rows.sum(axis=1) <= 0).any():
                raise CapsmedError(f"{where}: the rows of 'stain_matrix' are optical "
                                   "densities, each summing to more than 0; got "
                                   f"{rows.tolist()} (a negated vector?)")
            if rows[0, 0] < rows[1, 0]:
                raise CapsmedError(f"{where}: 'stain_matrix' must list hematoxylin first "
                                   "(the stain absorbing more red: the larger first "
                                   f"value); got {rows.tolist()} (rows swapped?)")
        else:
            means, stds = np.asarray(target["lab_means"]), np.asarray(target["lab_stds"])
            if ((means < LAB_LOW) | (means > LAB_HIGH)).any() or (
                    stds > (LAB_HIGH - LAB_LOW) / 2).any():
                raise CapsmedError(
                    f"{where}: 'lab_means' {means.tolist()} and 'lab_stds' "
                    f"{stds.tolist()} are not float CIELAB (L 0..100, a "
                    f"{LAB_LOW[1]:.0f}..{LAB_HIGH[1]:.0f}, b {LAB_LOW[2]:.0f}.."
                    f"{LAB_HIGH[2]:.0f}, stds at most half of each span); OpenCV's "
                    "8-bit LAB (L 0..255, a and b offset by 128) is not accepted")
        positive = "max_concentrations" if method == "macenko" else "lab_stds"
        if min(target[positive]) <= 0:
            raise CapsmedError(f"{where}: '{positive}' must be positive, got "
                               f"{list(target[positive])}")
        if method == "reinhard" and min(target["lab_stds"]) < MIN_LAB_STD:
            raise CapsmedError(f"{where}: 'lab_stds' {list(target['lab_stds'])} are below "
                               f"{MIN_LAB_STD}: a blank or colourless target, to which "
                               "every image would be flattened")
        origin = {k: str(v) for k, v in record.items()
                  if k in ("target", "target_digest")}
        return cls(method, target, origin)


def load_target(method: str, path: Path) -> StainNormaliser:
    """The normaliser for ``method`` from a reference image or a target JSON file (the
    ``stain_normalisation`` record of a dataset file, or the same keys by hand).

    Raises:
        CapsmedError: naming the file: unreadable, not RGB, or not a valid target.
    """
    from capsmed.data.digest import file_digest
    from capsmed.data.images import read_image, to_uint8

    path = Path(path)
    if not path.is_file():
        raise CapsmedError(f"{path}: no such stain target file")
    origin = {"target": path.name, "target_digest": file_digest(path)}
    if path.suffix.lower() == ".json":
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CapsmedError(f"{path}: cannot read the stain target JSON ({exc})") from None
        normaliser = StainNormaliser.from_record(record, path)
        if normaliser.method != method:
            raise CapsmedError(f"{path}: holds a {normaliser.method} target, but "
                               f"--stain-norm is {method}")
        return StainNormaliser(method, normaliser.target, origin)
    from capsmed.data.replay.images import alpha_on_white

    image = to_uint8(read_image(path), "full", path)
    if image.ndim != 3 or image.shape[-1] < 3:
        raise CapsmedError(f"{path}: a stain target must be an RGB image, got shape "
                           f"{list(image.shape)}")
    # transparent pixels are no stain: over white, not their (often black) colour
    fitted = StainNormaliser.fit(method, alpha_on_white(image), {"target": str(path)})
    return StainNormaliser(method, fitted.target, origin)  # the record keeps the name


def recorded_normaliser(preprocessing: dict[str, Any], where: object
                        ) -> StainNormaliser | None:
    """The normaliser a dataset's preprocessing record replays (None: none was used).

    Raises:
        CapsmedError: the record names a method but not its statistics.
    """
    method = preprocessing.get("stain_norm") or "none"
    if method == "none":
        return None
    record = preprocessing.get("stain_normalisation")
    if not isinstance(record, dict):
        raise CapsmedError(f"{where}: stain_norm is {method} but the record holds no "
                           "stain_normalisation statistics")
    return StainNormaliser.from_record(record, where)


def build_normaliser(method: str, target: str | None) -> StainNormaliser | None:
    """The normaliser a source config asks for (None for ``none``)."""
    return None if method == "none" or target is None else load_target(method, Path(target))
