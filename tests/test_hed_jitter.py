"""HED colour jitter (Tellez et al.): concentrations moved per image and stain on the
device, exact against hand-computed Beer-Lambert pixels, drawn after the geometry."""

from __future__ import annotations

import math

import pytest
import torch

from capsmed.errors import CapsmedError
from capsmed.train.augment import RGB_FROM_HED, AugmentSpec, augment_batch, get_recipe, hed_jitter

LOG_ADJUST = math.log(1e-6)
H, E, DAB = (torch.tensor(v) for v in RGB_FROM_HED)


def _pixel(stains: torch.Tensor) -> torch.Tensor:
    """The RGB [3] of densities ``stains`` [3] (H, E, DAB), by hand: Beer-Lambert in
    scikit-image's units."""
    od = stains[0] * H + stains[1] * E + stains[2] * DAB
    return torch.exp(od * LOG_ADJUST)


def _image(rgb: torch.Tensor, b: int = 2, side: int = 4) -> torch.Tensor:
    return rgb[None, :, None, None].expand(b, 3, side, side).clone()


def test_no_jitter_changes_nothing():
    x = torch.rand(4, 3, 8, 8) * 0.98 + 0.01
    out = hed_jitter(x, torch.ones(4, 3), torch.zeros(4, 3))
    assert torch.allclose(out, x, atol=1e-5)


def test_doubling_hematoxylin_gives_the_hand_computed_pixel():
    x = _image(_pixel(torch.tensor([0.1, 0.05, 0.0])))
    alpha = torch.tensor([[2.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    out = hed_jitter(x, alpha, torch.zeros(2, 3))
    assert torch.allclose(out[0, :, 0, 0], _pixel(torch.tensor([0.2, 0.05, 0.0])), atol=1e-5)
    assert torch.allclose(out[1], x[1], atol=1e-5)  # per image


def test_beta_adds_stain_to_glass():
    white = torch.ones(1, 3, 4, 4)
    out = hed_jitter(white, torch.ones(1, 3), torch.tensor([[0.0, 0.04, 0.0]]))
    assert torch.allclose(out[0, :, 2, 2], _pixel(torch.tensor([0.0, 0.04, 0.0])), atol=1e-5)
    assert out[0, 1, 2, 2] < out[0, 0, 2, 2]  # eosin absorbs green most: pink


def test_the_spec_jitters_each_image_and_draws_after_the_geometry():
    x = _image(_pixel(torch.tensor([0.08, 0.06, 0.0])), b=16, side=8)
    x = x + torch.linspace(0, 0.05, 8)[None, None, None, :]  # some texture to rotate
    geometry = augment_batch(x, AugmentSpec(rotation=30), torch.Generator().manual_seed(3))
    tiny = augment_batch(x, AugmentSpec(rotation=30, hed=1e-7),
                         torch.Generator().manual_seed(3))
    assert torch.allclose(tiny, geometry, atol=1e-5)  # the same rotations were drawn
    out = augment_batch(x, AugmentSpec(hed=0.05), torch.Generator().manual_seed(4))
    means = out.mean(dim=(2, 3))
    assert (means.std(dim=0) > 1e-3).all()  # identical inputs, different colours
    again = augment_batch(x, AugmentSpec(hed=0.05), torch.Generator().manual_seed(4))
    assert torch.equal(out, again)


def test_the_spec_reads_hed_and_refuses_bad_values_and_grey_images():
    assert get_recipe("rotation=10,hflip,vflip,hed=0.05") == AugmentSpec(
        rotation=10, hflip=True, vflip=True, hed=0.05)
    for bad in ("hed=1.5", "hed=-0.1", "hed=nan"):
        with pytest.raises(CapsmedError, match="hed in"):
            get_recipe(bad)
    with pytest.raises(CapsmedError, match="needs RGB images; these have 1 channel"):
        augment_batch(torch.rand(2, 1, 8, 8), AugmentSpec(hed=0.05), torch.Generator())
