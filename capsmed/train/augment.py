"""Data augmentation on the device, batched: one affine resampling per batch.

Rotation, translation and flips are composed into one 2x3 affine matrix per image and
applied with a single ``grid_sample`` call, so augmentation costs one kernel per batch
on a GPU and no per-image Python work. Flips map pixel centres onto pixel centres, so
a pure flip is exact.

Colour (RGB histology only): HED jitter (Tellez et al., 2018/2019) moves each image's
hematoxylin, eosin and DAB concentrations, from Ruifrok-Johnston colour deconvolution
in scikit-image's units (``rgb2hed``), to ``alpha * c + beta`` with ``alpha`` uniform
in ``1 +- hed`` and ``beta`` in ``+- hed`` per image and stain (Tellez's "HED-light"
is 0.05), then recombines them: three small matrix products per batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from capsmed.errors import CapsmedError


@dataclass(frozen=True)
class AugmentSpec:
    """Random transforms drawn independently per image.

    Attributes:
        rotation: Maximum rotation in degrees (uniform in +-rotation).
        translation: Maximum shift as a share of the image side (uniform, each axis).
        hflip, vflip: Flip left-right / up-down with probability 1/2.
        hed: HED colour jitter strength (0: none); RGB images only.
    """

    rotation: float = 0.0
    translation: float = 0.0
    hflip: bool = False
    vflip: bool = False
    hed: float = 0.0


# The papers' recipes. Paper 000's +-30 px translations of TUPAC16 patches happen at
# source resolution, when patches are cut (``capsmed preprocess tupac16 --jitter``):
# shifting the 28x28 patches again would push mitoses out of their patches (we looked),
# so the on-device medical recipe adds only paper 000's rotations and flips. DIARETDB1
# patches are not translated when cut (one lesion-centred patch per lesion by default):
# its +-30 px of 200 are a spec, 'rotation=10,translation=0.15,hflip,vflip'
# (pipelines/jimenez2018.yaml).
RECIPES = {
    "paper000-medical": AugmentSpec(rotation=10, hflip=True, vflip=True),
    "paper000-mnist": AugmentSpec(rotation=10),
    "paper000-fashion": AugmentSpec(rotation=10, hflip=True),
    "paper001": AugmentSpec(rotation=180, hflip=True, vflip=True),
    # paper 000's rotations alone: for images a flip may turn into another class (or
    # into no valid image), the default of the generic domain
    "paper000-rotation": AugmentSpec(rotation=10),
}


def get_recipe(name: str) -> AugmentSpec:
    """A named recipe, or a spec like ``rotation=15,translation=0.1,hflip,vflip``."""
    if name in RECIPES:
        return RECIPES[name]
    if "=" not in name and name not in ("hflip", "vflip") and "," not in name:
        raise CapsmedError(f"unknown augmentation recipe '{name}' (choose from: "
                           f"{', '.join(RECIPES)}, or give a spec such as "
                           "'rotation=15,translation=0.1,hflip,vflip')")
    values: dict[str, float | bool] = {}
    for item in filter(None, (part.strip() for part in name.split(","))):
        key, sep, value = item.partition("=")
        if key in values:  # the first value would be dropped without a word
            raise CapsmedError(f"augmentation spec '{name}': gives {key} twice; give it "
                               "once")
        try:
            if key in ("hflip", "vflip") and not sep:
                values[key] = True
            elif key in ("rotation", "translation", "hed") and sep:
                values[key] = float(value)
            else:
                raise ValueError
        except ValueError:
            raise CapsmedError(f"augmentation spec '{name}': cannot read '{item}' (use "
                               "rotation=DEG, translation=SHARE, hflip, vflip, "
                               "hed=STRENGTH)") from None
    spec = AugmentSpec(**values)  # type: ignore[arg-type]
    if not 0 <= spec.translation < 1 or not 0 <= spec.rotation < math.inf \
            or not 0 <= spec.hed < 1:  # NaN too
        raise CapsmedError(f"augmentation spec '{name}': rotation >= 0 degrees, "
                           "translation in [0, 1) of the image side, hed in [0, 1)")
    if spec == AugmentSpec():  # ',' or 'rotation=0': recorded as augmented, trained plain
        raise CapsmedError(f"augmentation spec '{name}' turns no transform on; give "
                           "one (rotation=DEG, translation=SHARE, hflip, vflip, "
                           "hed=STRENGTH) or train without --augment")
    return spec


# Ruifrok-Johnston stain vectors (rows: hematoxylin, eosin, DAB), as scikit-image's
# rgb_from_hed; densities in its units: -ln(max(rgb, 1e-6)) / ln(1e6)
RGB_FROM_HED = ((0.65, 0.70, 0.29), (0.07, 0.99, 0.11), (0.27, 0.57, 0.78))
_LOG_ADJUST = math.log(1e-6)


def hed_matrices(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The stain matrices ``rgb_from_hed`` and ``hed_from_rgb`` (float32, on ``device``).
    Made from host numbers and inverted with a check that waits for the device: made
    outside a CUDA graph (:func:`draw_transforms`), never inside one."""
    rgb_from_hed = torch.tensor(RGB_FROM_HED, dtype=torch.float32, device=device)
    return rgb_from_hed, torch.linalg.inv(rgb_from_hed)


def hed_jitter(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor,
               matrices: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """RGB images ``x`` [B, 3, H, W] in [0, 1] with their H, E and DAB concentrations
    set to ``alpha * c + beta`` (``alpha``, ``beta``: [B, 3]); dtype kept.
    ``matrices``: :func:`hed_matrices` made beforehand (made here if not given)."""
    _check_rgb(x.shape)
    rgb_from_hed, hed_from_rgb = matrices if matrices is not None else hed_matrices(x.device)
    od = torch.log(x.float().clamp_min(1e-6)) / _LOG_ADJUST  # [B, 3, H, W]
    stains = torch.einsum("bchw,cs->bshw", od, hed_from_rgb)
    stains = stains * alpha[:, :, None, None] + beta[:, :, None, None]
    od = torch.einsum("bshw,sc->bchw", stains, rgb_from_hed)
    return torch.exp(od * _LOG_ADJUST).clamp(0.0, 1.0).to(x.dtype)


def _check_rgb(shape: torch.Size | tuple[int, ...]) -> None:
    if shape[1] != 3:
        raise CapsmedError(f"HED colour jitter (hed=...) needs RGB images; these have "
                           f"{shape[1]} channel(s)")


class Transforms(NamedTuple):
    """One batch's random draws, ready to apply: the affine matrices (float32
    [B, 2, 3]) and, for HED jitter, its ``alpha`` and ``beta`` [B, 3] and the stain
    matrices (empty tuple without HED jitter). Only tensors: a CUDA graph of the step
    takes them as inputs, copied in before each replay, as it takes the batch."""

    theta: torch.Tensor
    hed: tuple[torch.Tensor, ...] = ()


def draw_transforms(spec: AugmentSpec, shape: torch.Size | tuple[int, ...],
                    generator: torch.Generator, device: torch.device,
                    share: tuple[int, torch.Tensor] | None = None) -> Transforms:
    """Draw ``spec``'s transforms for a batch of images of ``shape`` [B, C, H, W].

    All of the batch's random numbers are drawn here, from ``generator`` alone, and
    nothing here runs inside a CUDA graph: a graphed step draws eagerly before each
    replay, in the eager step's order, so its images are the eager run's. ``share`` =
    (global batch size, rows): the batch is those rows of a global batch (one rank's
    share under torchrun); the transforms are drawn for the whole global batch and
    these rows' are kept, so every rank draws what the single-process run draws for
    the same samples.
    """
    b = shape[0]
    n, rows = share if share is not None else (b, None)
    if spec.hed:
        _check_rgb(shape)

    def pick(values: torch.Tensor) -> torch.Tensor:
        return values if rows is None else values[rows.to(values.device)]

    def uniform(*size: int) -> torch.Tensor:  # in [-1, 1)
        return pick(torch.rand(n, *size, generator=generator, device=device) * 2 - 1)

    def flip(enabled: bool) -> torch.Tensor:
        if not enabled:
            return torch.ones(b, device=device)
        return pick(torch.where(torch.rand(n, generator=generator, device=device) < 0.5,
                                -1.0, 1.0))

    angle = uniform() * math.radians(spec.rotation)
    shift = uniform(2) * 2 * spec.translation  # affine_grid spans [-1, 1]: side = 2
    cos, sin = torch.cos(angle), torch.sin(angle)
    sx, sy = flip(spec.hflip), flip(spec.vflip)
    # theta maps output coordinates to input ones: input = A (output + shift), with
    # A = rotation * diag(flips). affine_grid's coordinates are x / (W/2) and y / (H/2),
    # so a rotation in pixels is D^-1 R D there (D = diag(W, H) / 2): on a non-square
    # image R alone would shear. The shift goes inside A: the content then moves by
    # -shift, at most the asked share along each image axis (paper 000 s3.3: "a
    # translation of +-30 pixels"); added after A (input = A output + shift) it was
    # rotated too, up to sqrt(2) times the share along an axis at 45 degrees.
    h_over_w = shape[2] / shape[3]
    a = torch.stack([torch.stack([cos * sx, -sin * sy * h_over_w], dim=1),
                     torch.stack([sin * sx / h_over_w, cos * sy], dim=1)], dim=1)
    theta = torch.cat([a, a @ shift.unsqueeze(2)], dim=2)
    if not spec.hed:
        return Transforms(theta)
    # drawn after the geometry, so recipes without colour draw as before
    alpha, beta = 1 + uniform(3) * spec.hed, uniform(3) * spec.hed
    return Transforms(theta, (alpha, beta, *hed_matrices(device)))


def apply_transforms(x: torch.Tensor, transforms: Transforms) -> torch.Tensor:
    """Apply drawn ``transforms`` to images ``x`` [B, C, H, W] in [0, 1]; shape and
    dtype kept; no random numbers and no host synchronisation (a CUDA graph can hold
    it). Pixels brought in from outside the image are reflected, which suits histology
    and fundus textures better than black corners."""
    grid = F.affine_grid(transforms.theta.to(x.dtype), list(x.shape), align_corners=False)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection",
                        align_corners=False)
    if transforms.hed:
        alpha, beta, *matrices = transforms.hed
        return hed_jitter(out, alpha, beta, (matrices[0], matrices[1]))
    return out


def augment_batch(x: torch.Tensor, spec: AugmentSpec, generator: torch.Generator,
                  share: tuple[int, torch.Tensor] | None = None) -> torch.Tensor:
    """Apply ``spec`` to images ``x`` [B, C, H, W] in [0, 1]; shape and dtype kept:
    :func:`draw_transforms` then :func:`apply_transforms` (``share``: see there)."""
    return apply_transforms(x, draw_transforms(spec, x.shape, generator, x.device, share))
