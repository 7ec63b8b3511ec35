"""Batched on-device augmentation: exact flips, label-free, recipes per dataset."""

from __future__ import annotations

import pytest
import torch
import yaml
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.domains import DOMAINS
from capsmed.errors import CapsmedError
from capsmed.train.augment import AugmentSpec, augment_batch, get_recipe
from capsmed.train.config import TrainConfig


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_identity_spec_changes_nothing():
    x = torch.rand(4, 3, 28, 28)
    out = augment_batch(x, AugmentSpec(), _gen())
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.allclose(out, x, atol=1e-5)


@pytest.mark.parametrize("spec, dim", [(AugmentSpec(hflip=True), -1),
                                       (AugmentSpec(vflip=True), -2)])
def test_flips_are_exact_and_random_per_image(spec, dim):
    x = torch.rand(32, 1, 28, 28)
    out = augment_batch(x, spec, _gen(1))
    same = [torch.allclose(o, i, atol=1e-5) for o, i in zip(out, x, strict=True)]
    flipped = [torch.allclose(o, i.flip(dim), atol=1e-5) for o, i in zip(out, x, strict=True)]
    assert all(a or b for a, b in zip(same, flipped, strict=True))
    assert any(same) and any(flipped)


def test_rotation_and_translation_move_content_but_keep_constants():
    constant = torch.full((8, 1, 28, 28), 0.7)
    spec = AugmentSpec(rotation=45, translation=0.3)
    assert torch.allclose(augment_batch(constant, spec, _gen()), constant, atol=1e-5)
    x = torch.zeros(8, 1, 28, 28)
    x[:, :, 4:10, 4:10] = 1.0  # an off-centre square
    out = augment_batch(x, spec, _gen())
    assert not torch.allclose(out, x, atol=1e-3)
    assert torch.allclose(augment_batch(x, spec, _gen()), out)  # seeded


@pytest.mark.parametrize("size", [(29, 57), (57, 29)])
def test_rotation_is_a_rotation_on_non_square_images(size):
    """affine_grid works in coordinates scaled by W/2 and H/2: a rotation matrix used
    there as is shears a non-square image (a point 20 px right moved 5 degrees)."""
    h, w = size
    x = torch.zeros(256, 1, h, w)
    x[:, :, h // 2 - 1:h // 2 + 2, w // 2 + 11:w // 2 + 14] = 1.0  # a 3x3 dot, 12 px right
    out = augment_batch(x, AugmentSpec(rotation=10.0), torch.Generator().manual_seed(0))
    ys, xs = torch.meshgrid(torch.arange(h) - (h - 1) / 2, torch.arange(w) - (w - 1) / 2,
                            indexing="ij")
    mass = out[:, 0].sum(dim=(1, 2))
    cy, cx = (out[:, 0] * ys).sum(dim=(1, 2)) / mass, (out[:, 0] * xs).sum(dim=(1, 2)) / mass
    radius, angle = torch.hypot(cx, cy), torch.rad2deg(torch.atan2(cy, cx))
    assert (radius - 12).abs().max() < 0.3
    assert angle.abs().max() <= 10.5 and angle.abs().max() > 8  # the whole +-10 deg range


def test_a_recipe_implies_augmentation_in_a_config_file_too():
    """--augment-recipe implies --augment; a recipe in a --config YAML (or a pipeline's
    train options) alone trained without augmentation."""
    assert TrainConfig(data="x.h5", arch="lenet", augment_recipe="paper000-mnist").augment
    assert not TrainConfig(data="x.h5", arch="lenet").augment


def test_recipes_follow_the_domain_and_reject_unknown_names():
    def recipe(domain, **kw):
        cfg = TrainConfig(data="x.h5", arch="lenet", **kw)
        return cfg.resolved(DOMAINS[domain]).augment_recipe

    assert recipe("histology", augment=True) == "paper000-medical"
    assert recipe("digits", augment=True) == "paper000-mnist"
    assert recipe("histology", augment=True, augment_recipe="paper001") == "paper001"
    assert recipe("histology") is None  # no augmentation, no recipe
    # digits are never flipped by a default recipe, generic sets are only rotated
    for domain in ("digits", "generic"):
        spec = get_recipe(recipe(domain, augment=True))
        assert not spec.hflip and not spec.vflip and spec.rotation == 10
    # paper 000's medical translations are the extraction jitter, not applied twice
    assert get_recipe("paper000-medical").translation == 0
    with pytest.raises(CapsmedError, match="unknown augmentation recipe"):
        TrainConfig(data="x.h5", arch="lenet", augment=True, augment_recipe="mixup")


@pytest.mark.parametrize("spec", ["rotation=10,rotation=90", "hflip,rotation=5,hflip"])
def test_a_spec_giving_a_transform_twice_is_refused(spec):
    """rotation=10,rotation=90 trained with 90 degrees, the 10 dropped silently."""
    with pytest.raises(CapsmedError, match="twice"):
        get_recipe(spec)


@pytest.mark.parametrize("spec", [",", "rotation=0", "translation=0,hed=0"])
def test_a_spec_that_turns_no_transform_on_is_refused(spec):
    """--augment-spec ',' or 'rotation=0' trained on plain images while config.yaml and
    the reports' protocol said 'augment'."""
    with pytest.raises(CapsmedError, match="turns no transform on"):
        get_recipe(spec)
    with pytest.raises(CapsmedError, match="turns no transform on"):
        TrainConfig(data="x.h5", arch="lenet", augment_recipe=spec)


def test_train_with_augmentation_through_the_cli(tiny_h5, tmp_path):
    run = tmp_path / "aug"
    result = CliRunner().invoke(app, ["-q", "train", "--data", str(tiny_h5), "--arch",
                                      "lenet", "--epochs", "1", "--augment", "--out",
                                      str(run)])
    assert result.exit_code == 0, result.stderr
    config = yaml.safe_load((run / "config.yaml").read_text())["train"]
    assert config["augment"] is True and config["augment_recipe"] == "paper000-medical"


@pytest.mark.parametrize("size", [(41, 41), (25, 41)])
def test_translation_stays_within_its_share_of_each_axis_when_rotated_too(size):
    """The shift was added after the rotation, so it was rotated with the image: with
    rotation=45, translation=0.1 a 41 px image's centre moved up to 5.8 px along an
    axis instead of 4.1 (paper 000 s3.3 translates by +-30 px along each axis)."""
    h, w = size
    x = torch.zeros(4000, 1, h, w)
    x[:, :, h // 2, w // 2] = 1.0  # one bright pixel at the centre: rotation keeps it
    out = augment_batch(x, get_recipe("rotation=45,translation=0.1"), _gen())
    ys, xs = torch.meshgrid(torch.arange(h) - h // 2, torch.arange(w) - w // 2,
                            indexing="ij")
    mass = out[:, 0].sum(dim=(1, 2))
    for coords, side in ((xs, w), (ys, h)):
        shift = ((out[:, 0] * coords).sum(dim=(1, 2)) / mass).abs()
        assert shift.max() <= 0.1 * side + 0.15 and shift.max() > 0.9 * 0.1 * side
