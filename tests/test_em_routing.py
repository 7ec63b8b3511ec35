"""Matrix capsules with EM routing: the routing maths, the capsule layers, em-capsnet."""

from __future__ import annotations

import pytest
import torch

from capsmed.errors import CapsmedError
from capsmed.models import count_parameters, create_model
from capsmed.models.capsules import em_routing, lambda_schedule
from capsmed.models.em_capsnet import (
    ClassMatrixCapsules,
    ConvMatrixCapsules,
    PrimaryMatrixCapsules,
)
from capsmed.train.losses import spread_loss, training_loss
from tests.helpers import TINY

# Reduced widths for em-capsnet: a 4x4 primary grid at 28x28 and 32x32, 6x6 at 48x48.
TINY_EM = {**TINY["em-capsnet"], "mid_types": 4}  # create_model takes it at any depth


def _betas(n_out: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(n_out), torch.zeros(n_out)


def test_em_routing_shapes_couplings_and_activation_range():
    torch.manual_seed(0)
    votes, acts = torch.randn(2, 6, 3, 16), torch.rand(2, 6)
    pose, a, r = em_routing(votes, acts, *_betas(3), iterations=3, return_couplings=True)
    assert pose.shape == (2, 3, 16) and a.shape == (2, 3) and r.shape == (2, 6, 3)
    assert torch.allclose(r.sum(dim=2), torch.ones(2, 6), atol=1e-6)
    assert ((a > 0) & (a < 1)).all()
    assert not torch.allclose(r, torch.full_like(r, 1 / 3))  # 3 iterations do reassign
    # the returned R is the one of the last M-step: the poses are its weighted means
    w = r * acts[..., None]
    mu = torch.einsum("bij,bijp->bjp", w / w.sum(dim=1, keepdim=True), votes)
    assert torch.allclose(pose, mu, atol=1e-5)
    _, _, r1 = em_routing(votes, acts, *_betas(3), iterations=1, return_couplings=True)
    assert torch.allclose(r1, torch.full_like(r1, 1 / 3))  # one iteration: uniform R
    assert em_routing(votes, acts, *_betas(3))[2] is None


def test_agreeing_votes_win_over_scattered_votes():
    torch.manual_seed(1)
    votes = torch.empty(1, 8, 2, 16)
    votes[:, :, 0] = torch.randn(16)  # every input votes the same pose for output 0
    votes[:, :, 1] = torch.randn(8, 16) * 3.0  # and scattered poses for output 1
    acts = torch.ones(1, 8)
    # one iteration: uniform R, so both outputs get the same mass and only sigma differs
    pose, a, r = em_routing(votes, acts, *_betas(2), iterations=1, return_couplings=True)
    var = ((votes - pose[:, None]) ** 2 * r[..., None]).sum(dim=1) / r.sum(dim=1)[..., None]
    assert var[0, 0].mean() < 1e-6 < var[0, 1].mean()
    assert a[0, 0] > 0.5 > a[0, 1]
    assert torch.allclose(pose[0, 0], votes[0, 0, 0], atol=1e-5)
    _, a3, r3 = em_routing(votes, acts, *_betas(2), iterations=3, return_couplings=True)
    assert a3[0, 0] > a3[0, 1]
    assert (r3[0, :, 0] > 0.99).all()  # the E-step hands every input to output 0


def test_single_output_capsule_takes_everything():
    votes, acts = torch.randn(2, 5, 1, 16), torch.rand(2, 5)
    _, a, r = em_routing(votes, acts, *_betas(1), return_couplings=True)
    assert torch.equal(r, torch.ones(2, 5, 1))
    assert a.shape == (2, 1)


def test_gradients_reach_votes_activations_and_betas():
    torch.manual_seed(2)
    votes = torch.randn(2, 6, 3, 16, requires_grad=True)
    acts = torch.rand(2, 6).requires_grad_()
    beta_u, beta_a = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    pose, a, _ = em_routing(votes, acts, beta_u, beta_a)
    (pose.square().sum() + (a * torch.arange(3.0)).sum()).backward()
    for name, t in (("votes", votes), ("acts", acts), ("beta_u", beta_u), ("beta_a", beta_a)):
        assert t.grad is not None and torch.isfinite(t.grad).all(), name
        assert t.grad.abs().sum() > 0, name


def test_routing_is_fp32_under_autocast():
    torch.manual_seed(3)
    votes = torch.randn(2, 6, 3, 16).to(torch.bfloat16)
    acts = torch.rand(2, 6).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pose, a, r = em_routing(votes, acts, *_betas(3), return_couplings=True)
    assert pose.dtype == a.dtype == r.dtype == torch.float32
    ref_pose, ref_a, _ = em_routing(votes.float(), acts.float(), *_betas(3))
    assert torch.allclose(pose, ref_pose) and torch.allclose(a, ref_a)


def test_lambda_schedule_rises_toward_final_lambda():
    lams = lambda_schedule(3, 0.01)
    assert lams == pytest.approx([0.01 * 0.05, 0.01 * 0.0975, 0.01 * 0.142625])
    assert lams == sorted(lams) and lams[-1] < 0.01


def test_em_routing_rejects_bad_arguments():
    with pytest.raises(ValueError, match="at least one iteration"):
        em_routing(torch.randn(1, 2, 3, 16), torch.rand(1, 2), *_betas(3), iterations=0)
    with pytest.raises(ValueError, match="activations"):
        em_routing(torch.randn(1, 2, 3, 16), torch.rand(1, 3), *_betas(3))


def test_primary_matrix_capsules_shapes():
    poses, acts = PrimaryMatrixCapsules(8, types=4)(torch.randn(2, 8, 5, 6))
    assert poses.shape == (2, 5, 6, 4, 16) and acts.shape == (2, 5, 6, 4)
    assert ((acts > 0) & (acts < 1)).all()


@pytest.mark.parametrize("side, grid", [(7, 3), (8, 3), (9, 4), (3, 1)])
def test_conv_matrix_capsules_grid_for_kernel_3_stride_2(side, grid):
    layer = ConvMatrixCapsules(4, 5, kernel=3, stride=2, iterations=2)
    poses, acts = layer(torch.randn(2, side, side, 4, 16), torch.rand(2, side, side, 4))
    assert poses.shape == (2, grid, grid, 5, 16) and acts.shape == (2, grid, grid, 5)


def test_conv_matrix_capsules_route_the_right_window():
    torch.manual_seed(4)
    layer = ConvMatrixCapsules(3, 2, kernel=3, stride=2, iterations=3)
    layer.beta_u.data.normal_()
    poses, acts = torch.randn(1, 7, 7, 3, 16), torch.rand(1, 7, 7, 3)
    out_pose, out_act = layer(poses, acts)
    # output (row 1, col 2) sees input rows 2..4 and cols 4..6, ordered (row, col, type)
    win = poses[0, 2:5, 4:7].reshape(9, 3, 4, 4)
    w = layer.weight.reshape(9, 3, 2, 4, 4)
    votes = torch.einsum("kiac,kiocd->kioad", win, w).reshape(1, 27, 2, 16)
    pose, act, _ = em_routing(votes, acts[:, 2:5, 4:7].reshape(1, 27), layer.beta_u,
                              layer.beta_a, 3)
    assert torch.allclose(out_pose[0, 1, 2], pose[0], atol=1e-5)
    assert torch.allclose(out_act[0, 1, 2], act[0], atol=1e-6)


def test_class_matrix_capsules_shapes_and_coordinate_addition():
    torch.manual_seed(5)
    plain = ClassMatrixCapsules(4, 3, iterations=3, coordinate_addition=False)
    added = ClassMatrixCapsules(4, 3, iterations=3, coordinate_addition=True)
    added.load_state_dict(plain.state_dict())
    poses, acts = torch.randn(2, 3, 3, 4, 16), torch.rand(2, 3, 3, 4)
    pose, a, r = plain(poses, acts, return_couplings=True)
    assert pose.shape == (2, 3, 16) and a.shape == (2, 3) and r.shape == (2, 36, 3)
    pose_ca, a_ca, _ = added(poses, acts)
    assert not torch.allclose(pose, pose_ca) and not torch.allclose(a, a_ca)
    # a 1x2 grid whose second capsule is inactive: the pose is the first capsule's vote,
    # shifted by its cell centre (row 0.5, col 0.25) in entries (0, 3), (1, 3) only
    one_plain = ClassMatrixCapsules(1, 2, iterations=1, coordinate_addition=False)
    one_added = ClassMatrixCapsules(1, 2, iterations=1, coordinate_addition=True)
    one_added.load_state_dict(one_plain.state_dict())
    p1, a1 = torch.randn(1, 1, 2, 1, 16), torch.tensor([[[[1.0], [0.0]]]])
    shift = one_added(p1, a1)[0] - one_plain(p1, a1)[0]
    expected = torch.zeros(1, 2, 16)
    expected[..., 3], expected[..., 7] = 0.5, 0.25
    assert torch.allclose(shift, expected, atol=1e-5)


@pytest.mark.parametrize("layers, coordinate_addition", [(2, False), (3, False), (3, True)])
@pytest.mark.parametrize("channels, size", [(1, 32), (3, 48)])
def test_em_capsnet_forward_backward(layers, coordinate_addition, channels, size):
    torch.manual_seed(0)
    model = create_model("em-capsnet", in_channels=channels, num_classes=3, input_size=size,
                         capsule_layers=layers, coordinate_addition=coordinate_addition,
                         **TINY_EM)
    assert model.loss_kind == "spread"
    x, y = torch.rand(2, channels, size, size), torch.tensor([0, 2])
    out = model(x, target=y, return_couplings=True)
    assert out.scores.shape == (2, 3) and out.capsules.shape == (2, 3, 16)
    assert ((out.scores > 0) & (out.scores < 1)).all()
    grid = size // 8 if layers == 2 else (size // 8 - 3) // 2 + 1
    types = TINY_EM["primary_types"] if layers == 2 else TINY_EM["mid_types"]
    assert out.couplings.shape == (2, grid * grid * types, 3)
    assert torch.allclose(out.couplings.sum(dim=2), torch.ones(2, grid * grid * types))
    loss = training_loss(model.loss_kind, out, x, y, 0.0)
    assert loss.item() == pytest.approx(spread_loss(out.scores, y).item())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"no gradient reaches {name}"


def test_em_capsnet_scores_are_fp32_under_autocast():
    model = create_model("em-capsnet", in_channels=1, num_classes=3, input_size=28, **TINY_EM)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.rand(2, 1, 28, 28))
    assert out.scores.dtype == torch.float32 and torch.isfinite(out.scores).all()


@pytest.mark.parametrize("layers, expected", [(2, 2_378_110), (3, 2_525_630)])
def test_em_capsnet_default_parameter_counts(layers, expected):
    # 15 classes; the count does not depend on the input size (weights shared on the grid)
    assert count_parameters(create_model("em-capsnet", capsule_layers=layers)) == expected


def test_em_capsnet_minimum_input_size_is_exact():
    # defaults: the 7x7/2 conv and 3 stride-2 blocks divide by 16; Mid-Caps need 3x3
    model = create_model("em-capsnet", capsule_layers=3, input_size=33, **{
        **TINY_EM, "stem_blocks": 3})
    assert model(torch.rand(1, 3, 33, 33)).scores.shape == (1, 15)
    with pytest.raises(CapsmedError, match="at least 33x33 pixels, got 32x32"):
        create_model("em-capsnet", capsule_layers=3, input_size=32)
    with pytest.raises(CapsmedError, match="at least 17x17 pixels, got 16x20"):
        create_model("em-capsnet", capsule_layers=3, input_size=(16, 20), **TINY_EM)


@pytest.mark.parametrize("option, match", [
    ({"capsule_layers": 5}, "capsule_layers must be 2, 3 or 4"),
    ({"routing_iters": 0}, "routing_iters must be >= 1"),
    ({"final_lambda": 0.0}, "final_lambda must be > 0"),
    ({"primary_types": 0}, "primary_types must be >= 1"),
    ({"stem_blocks": -1}, "stem_blocks must be >= 0"),
    ({"stem_channels": 4, "base_width": 4}, "stem_channels \\* base_width must be >= 64"),
])
def test_em_capsnet_invalid_options_fail_clearly(option, match):
    with pytest.raises(CapsmedError, match=match):
        create_model("em-capsnet", **option)


@pytest.mark.parametrize("arch", ["em-capsnet", "parallel-em"])
@pytest.mark.parametrize("pose", [3, 5])
def test_pose_size_switch_gives_capsules_of_9_and_25(arch, pose):
    # paper 001 compares capsule sizes 9, 16 and 25: 3x3, 4x4 and 5x5 pose matrices
    model = create_model(arch, num_classes=3, in_channels=1, input_size=32, pose=pose,
                         **TINY[arch])
    x, y = torch.rand(2, 1, 32, 32), torch.tensor([0, 1])
    out = model(x, target=y)
    assert out.capsules.shape == (2, 3, pose * pose)
    training_loss("spread", out, x, y, 0.0).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for p in model.parameters())
