"""Every registered model at tiny size; paper parameter counts; capsule maths."""

from __future__ import annotations

import pytest
import torch

from capsmed.errors import CapsmedError
from capsmed.models import count_parameters, create_model, list_models
from capsmed.models.capsules import dynamic_routing, squash
from capsmed.train.losses import margin_loss, reconstruction_loss, spread_loss, training_loss
from tests.helpers import TINY, TINY_CAPSNET, TINY_FC


@pytest.mark.parametrize("entry", list_models(), ids=lambda e: e.name)
@pytest.mark.parametrize("channels, size", [(1, 28), (3, 32)])
def test_registry_model_forward_backward(entry, channels, size):
    torch.manual_seed(0)
    model = create_model(entry.name, in_channels=channels, num_classes=3, input_size=size,
                         **TINY.get(entry.name, {}))
    x = torch.rand(2, channels, size, size)
    y = torch.tensor([0, 2])
    out = model(x, target=y)
    assert out.scores.shape == (2, 3)
    assert torch.isfinite(out.scores).all()
    if out.reconstruction is not None:
        assert out.reconstruction.shape == x.shape
    training_loss(model.loss_kind, out, x, y, recon_weight=0.1).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"no gradient reaches {name}"


@pytest.mark.parametrize("name, size, kwargs, expected", [
    # paper 000 Table 1 (28x28, 1 channel, 10 classes): 8.2M, ~60K, 35.4M
    ("capsnet", 28, {}, 8_215_568),
    ("lenet", 28, {}, 61_706),
    ("baseline", 28, {}, 35_445_522),
    # paper 004 Table 1 (40x40 affNIST setting): 13.5M, 35.4M, 5.3M, 7.5M (see docstring)
    ("capsnet", 40, {}, 13_475_648),
    ("convnet-fc", 40, {}, 35_445_522),
    ("convnet-avg", 40, {}, 5_332_234),
    ("aff-capsnet", 40, {}, 7_578_688),
    # paper 001: ResNeXt-50 32x4d, ~23M with 15 classes (25,028,904 with 1,000 classes)
    ("resnext50", 128, {"in_channels": 3, "num_classes": 15}, 23_010_639),
    ("resnext50", 224, {"in_channels": 3, "num_classes": 1000}, 25_028_904),
])
def test_paper_parameter_counts(name, size, kwargs, expected):
    model = create_model(name, input_size=size, **{"in_channels": 1, "num_classes": 10,
                                                   **kwargs})
    assert count_parameters(model) == expected


# Paper 004 Table 3: parameters (millions, as printed) per kernel size at 40x40.
TABLE3 = {
    "capsnet": {3: "16.1", 5: "14.4", 7: "13.5", 9: "13.5", 11: "14.3"},
    "convnet-fc": {3: "49.5", 5: "35.4", 7: "25.2", 9: "18.8", 11: "16.19"},
    "convnet-avg": {3: "0.59", 7: "3.23", 9: "5.30", 11: "7.96"},  # k=5 printed 1.70: typo
}


@pytest.mark.parametrize("name, k, printed",
                         [(n, k, v) for n, row in TABLE3.items() for k, v in row.items()])
def test_kernel_size_switch_reproduces_paper_004_table_3(name, k, printed):
    params = count_parameters(create_model(name, input_size=40, kernel_size=k))
    # the printed precision is inconsistent (5,332,234 is printed "5.30"): within 1%
    assert abs(params / 1e6 - float(printed)) / float(printed) < 0.01


@pytest.mark.parametrize("name, shape", [("capsnet", (1, 28, 28)), ("baseline", (1, 28, 28)),
                                         ("resnext50", (3, 64, 64))])
def test_full_size_model_one_step_at_batch_2(name, shape):
    torch.manual_seed(0)
    model = create_model(name, num_classes=2, in_channels=shape[0], input_size=shape[1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.rand(2, *shape), torch.tensor([0, 1])
    before = [p.detach().clone() for p in model.parameters()]
    loss = training_loss(model.loss_kind, model(x, target=y), x, y, 5e-4)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    changed = sum(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert changed > len(before) // 2


def test_too_small_input_and_unknown_options_fail_clearly():
    with pytest.raises(CapsmedError, match="at least 17x17"):
        create_model("capsnet", input_size=16)
    with pytest.raises(CapsmedError, match="no option"):
        create_model("lenet", colour=True)
    with pytest.raises(CapsmedError, match="unknown architecture"):
        create_model("alexnet")


@pytest.mark.parametrize("name, kwargs, text", [
    # a third width was dropped: the run recorded widths [3, 4, 5] for a 2-conv LeNet
    ("lenet", {"widths": (3, 4, 5)}, "lenet widths must be two numbers"),
    ("convnet-avg", {"channels": (4, 4, 8)}, "convnet-avg channels must be two numbers"),
    # kernel_size 0 / false fell back to the 9x9 defaults, true built 1x1 kernels
    ("capsnet", {"kernel_size": 0}, "kernel_size must be a positive integer, got 0"),
    ("capsnet", {"kernel_size": True}, "kernel_size must be a positive integer, got True"),
    ("aff-capsnet", {"kernel_size": False}, "kernel_size must be a positive integer"),
    # a negative rate meant no dropout; with no hidden layer dropout had nowhere to go
    ("baseline", {"dropout": -0.5}, r"dropout must be within \[0, 1\), got -0.5"),
    ("convnet-fc", {"hidden": ()}, "with hidden=\\[\\] it has no effect"),
    # routed once, as 0 or 1 iterations, instead of refused (capsnet refuses it)
    ("parallel-dr", {"routing_iters": -1}, "routing_iters must be >= 0, got -1"),
    # em-capsnet refuses these; parallel-em trained with constant / inverted activations
    ("parallel-em", {"final_lambda": 0.0}, "final_lambda must be > 0, got 0.0"),
    ("parallel-em", {"final_lambda": -0.01}, "final_lambda must be > 0"),
    ("parallel-em", {"pose": 1}, "pose must be >= 2"),
    # 2 layers split the primary types evenly: 4 over 3 branches built 3 (1 each), and
    # 4 over 5 built 5; config.yaml still said primary_types=4
    ("parallel-em", {"capsule_layers": 2, "branches": 3},
     "4 types cannot be split over 3 branches"),
    ("parallel-em", {"capsule_layers": 2, "branches": 5},
     "4 types cannot be split over 5 branches"),
])
def test_option_values_the_model_would_not_use_as_given_are_refused(name, kwargs, text):
    with pytest.raises(CapsmedError, match=text):
        create_model(name, num_classes=3, **{**TINY.get(name, {}), **kwargs})


def test_squash_matches_hand_values():
    s = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    v = squash(s)
    # |s| = 5: length 25/26, direction (0.6, 0.8)
    assert torch.allclose(v[0], torch.tensor([0.6, 0.8]) * 25 / 26, atol=1e-6)
    assert torch.equal(v[1], torch.zeros(2))


def test_routing_couplings_sum_to_one_over_outputs_and_follow_agreement():
    torch.manual_seed(0)
    u_hat = torch.randn(2, 6, 3, 4) * 0.1
    u_hat[:, :, 1] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # all inputs agree on output 1
    _, c1 = dynamic_routing(u_hat, iterations=1, return_couplings=True)
    assert torch.allclose(c1, torch.full_like(c1, 1 / 3))  # one pass = uniform
    _, c0 = dynamic_routing(u_hat, iterations=0, return_couplings=True)
    assert torch.equal(c0, c1)  # 0 agreement steps: uniform too
    v, c3 = dynamic_routing(u_hat, iterations=3, return_couplings=True)
    assert torch.allclose(c3.sum(dim=2), torch.ones(2, 6), atol=1e-6)
    assert (c3[:, :, 1] > 1 / 3).all()  # agreement increases the coupling
    assert v.shape == (2, 3, 4)


def test_margin_and_reconstruction_losses_by_hand():
    lengths = torch.tensor([[0.95, 0.3], [0.5, 0.05]])
    target = torch.tensor([0, 0])
    # sample 1: present 0 (0.95 > 0.9), absent 0.5*(0.3-0.1)^2 = 0.02
    # sample 2: present (0.9-0.5)^2 = 0.16, absent 0 (0.05 < 0.1)
    assert margin_loss(lengths, target).item() == pytest.approx((0.02 + 0.16) / 2)
    recon = torch.zeros(2, 1, 2, 2)
    images = torch.ones(2, 1, 2, 2)
    assert reconstruction_loss(recon, images).item() == pytest.approx(4.0)


def test_standardize_uses_given_statistics_and_defaults_to_identity():
    x = torch.full((1, 1, 28, 28), 0.75)
    plain = create_model("lenet", num_classes=2)
    assert torch.equal(plain.standardize(x), x)
    model = create_model("lenet", num_classes=2, input_mean=[0.5], input_std=[0.25])
    assert torch.allclose(model.standardize(x), torch.ones_like(x))
    assert "standardize.mean" not in model.state_dict()  # lives in the arguments instead
    with pytest.raises(ValueError, match="need 3 values"):
        create_model("lenet", in_channels=3, input_mean=[0.5], input_std=[0.2])


@pytest.mark.parametrize("given", [{"input_mean": [0.9]}, {"input_std": [0.1]}])
def test_input_mean_or_std_alone_is_refused_not_dropped(given):
    # --model-arg input_mean=[0.9] with --no-standardize built an unstandardised model
    # while config.yaml and checkpoint.json recorded the mean
    from capsmed.train.model_options import build_model

    with pytest.raises(CapsmedError, match="input_mean and input_std go together"):
        build_model("lenet", {"in_channels": 1, "num_classes": 2, "input_size": [28, 28],
                              **given}, (1, 28, 28))


def test_infinite_standardisation_is_refused():
    # input_std=[.inf] scaled every pixel to 0: a model trained on blank images
    with pytest.raises(ValueError, match="must be finite"):
        create_model("lenet", input_mean=[0.5], input_std=[float("inf")])


@pytest.mark.parametrize("name", ["lenet", "capsnet", "convnet-avg"])
def test_standardized_model_refuses_other_channels_and_integer_pixels(name):
    # a 1-channel batch broadcast against the 3-channel mean, and uint8 0-255 pixels,
    # used to be classified without a word
    model = create_model(name, in_channels=3, num_classes=2, input_mean=[0.5, 0.4, 0.3],
                         input_std=[0.2, 0.2, 0.2]).eval()
    assert model(torch.rand(2, 3, 28, 28)).scores.shape == (2, 2)
    with pytest.raises(CapsmedError, match=r"float images \[N, 3, H, W\].*\[2, 1, 28, 28\]"):
        model(torch.rand(2, 1, 28, 28))
    with pytest.raises(CapsmedError, match="uint8"):
        model(torch.randint(0, 256, (2, 3, 28, 28), dtype=torch.uint8))


def _tiny_capsnet(**switches):
    torch.manual_seed(0)
    return create_model("capsnet", num_classes=3, **{**TINY_CAPSNET, **switches})


def test_routing_none_means_uniform_couplings():
    x = torch.rand(2, 1, 28, 28)
    none = _tiny_capsnet(routing="none")
    out = none(x, return_couplings=True)
    assert torch.allclose(out.couplings, torch.full_like(out.couplings, 1 / 3))
    dynamic = _tiny_capsnet(routing="dynamic", routing_iters=3)
    dynamic.load_state_dict(none.state_dict())
    routed = dynamic(x, return_couplings=True)
    assert not torch.allclose(routed.couplings, out.couplings)
    assert not torch.allclose(routed.scores, out.scores)


def test_shared_transform_is_one_matrix_per_class():
    shared, full = _tiny_capsnet(shared_transform=True), _tiny_capsnet()
    assert shared.classes.weight.shape[0] == 1
    assert full.classes.weight.shape[0] == 4 * 6 * 6  # primary types x grid
    # every input capsule's vote for class j goes through the same matrix
    u = torch.randn(2, 144, 4)
    u_same = u.clone()
    u_same[:, 1:] = u[:, :1]
    _, _, c = shared.classes(u_same, return_couplings=True)
    assert torch.allclose(c[:, 0], c[:, 1])


def test_squash_switch_bounds_capsule_lengths():
    x = torch.rand(2, 1, 28, 28) * 50  # large activations
    squashed, raw = _tiny_capsnet(), _tiny_capsnet(squash=False)
    raw.load_state_dict(squashed.state_dict())
    assert (squashed(x).scores < 1).all()
    assert (raw(x).scores > 1).any()


def test_reconstruction_switch():
    x, y1, y2 = torch.rand(2, 1, 28, 28), torch.tensor([0, 0]), torch.tensor([1, 1])
    conditional = _tiny_capsnet()
    assert not torch.allclose(conditional(x, target=y1).reconstruction,
                              conditional(x, target=y2).reconstruction)
    plain = _tiny_capsnet(reconstruction="plain")
    assert torch.allclose(plain(x, target=y1).reconstruction,
                          plain(x, target=y2).reconstruction)
    none = _tiny_capsnet(reconstruction="none")
    assert none(x, target=y1).reconstruction is None and none.decoder is None
    with pytest.raises(CapsmedError, match="reconstruction must be one of"):
        _tiny_capsnet(reconstruction="sometimes")
    with pytest.raises(CapsmedError, match="routing must be one of dynamic, em, none"):
        _tiny_capsnet(routing="magic")


def test_baseline_dropout_is_active_only_in_training():
    model = create_model("baseline", num_classes=2, **TINY_FC, dropout=0.9)
    x = torch.rand(4, 1, 28, 28)
    model.eval()
    assert torch.equal(model(x).scores, model(x).scores)
    model.train()
    assert not torch.equal(model(x).scores, model(x).scores)


def test_routing_eta_interpolates_between_frozen_and_full_routing():
    torch.manual_seed(1)
    u_hat = torch.randn(2, 8, 3, 4)
    _, full = dynamic_routing(u_hat, 3, return_couplings=True, eta=1.0)
    _, frozen = dynamic_routing(u_hat, 3, return_couplings=True, eta=0.0)
    _, soft = dynamic_routing(u_hat, 3, return_couplings=True, eta=0.3)
    assert torch.allclose(frozen, torch.full_like(frozen, 1 / 3))  # eta 0: never updated
    assert torch.allclose(soft.sum(dim=2), torch.ones(2, 8), atol=1e-6)
    # the soft update moves the couplings away from uniform, but less than eta=1
    assert 0 < (soft - frozen).abs().sum() < (full - frozen).abs().sum()
    with pytest.raises(ValueError, match="within \\[0, 1\\]"):
        dynamic_routing(u_hat, 3, eta=1.5)


def test_grad_through_routing_switch():
    torch.manual_seed(2)
    u_hat = torch.randn(2, 8, 3, 4, requires_grad=True)
    v, c = dynamic_routing(u_hat, 3, return_couplings=True, grad_through_routing=False)
    (grad_last,) = torch.autograd.grad(v.sum(), u_hat)
    # False = gradient of the last weighted sum with the couplings held constant
    v_const = squash(torch.einsum("bij,bijd->bjd", c.detach(), u_hat))
    (grad_expected,) = torch.autograd.grad(v_const.sum(), u_hat)
    assert torch.allclose(grad_last, grad_expected, atol=1e-6)
    v_all, _ = dynamic_routing(u_hat, 3, grad_through_routing=True)
    (grad_all,) = torch.autograd.grad(v_all.sum(), u_hat)
    assert torch.allclose(v_all, v, atol=1e-6)  # same forward
    assert not torch.allclose(grad_all, grad_last, atol=1e-6)  # different backward


@pytest.mark.parametrize("name", ["capsnet", "aff-capsnet"])
def test_decoder_widths_without_a_decoder_are_refused(name):
    """reconstruction=none builds no decoder: decoder_hidden was accepted and recorded."""
    from capsmed.train.model_options import check_inert_options

    kwargs = {**TINY_CAPSNET, "reconstruction": "none"}
    assert create_model(name, num_classes=3, **kwargs).decoder is None  # inert indeed
    with pytest.raises(CapsmedError, match=f"{name}: decoder_hidden has no effect with "
                       "reconstruction=none"):
        check_inert_options(name, kwargs)
    check_inert_options(name, {**TINY_CAPSNET, "reconstruction": "plain"})


@pytest.mark.parametrize("iters", [0, 1])
def test_routing_options_inert_without_an_agreement_step_are_refused_unless_default(iters):
    """At 0 or 1 routing iterations the couplings stay uniform: an eta or
    grad_through_routing of an ablation trained the very model the defaults give,
    while config.yaml recorded the ablation. The default stays allowed (routing2019's
    grid states eta 1.0 at n_EM = 1)."""
    from capsmed.train.model_options import check_inert_options

    torch.manual_seed(3)
    u_hat = torch.randn(2, 8, 3, 4)
    v_soft, _ = dynamic_routing(u_hat, iters, eta=0.1, grad_through_routing=False)
    assert torch.equal(v_soft, dynamic_routing(u_hat, iters)[0])  # inert indeed
    with pytest.raises(CapsmedError, match=f"capsnet: routing_eta=0.1 has no effect with "
                       f"routing_iters={iters}"):
        check_inert_options("capsnet", {"routing_iters": iters, "routing_eta": 0.1})
    with pytest.raises(CapsmedError, match="grad_through_routing=False has no effect"):
        check_inert_options("capsnet", {"routing_iters": iters,
                                        "grad_through_routing": False})
    check_inert_options("capsnet", {"routing_iters": iters, "routing_eta": 1.0,
                                    "grad_through_routing": True})
    check_inert_options("capsnet", {"routing_iters": 2, "routing_eta": 0.1,
                                    "grad_through_routing": False})


def test_spread_loss_by_hand():
    scores = torch.tensor([[0.8, 0.5, 0.1]])
    # target 0: gaps 0.9 - 0.3 = 0.6 and 0.9 - 0.7 = 0.2 -> 0.36 + 0.04
    assert spread_loss(scores, torch.tensor([0])).item() == pytest.approx(0.40)
    assert spread_loss(scores, torch.tensor([0]), margin=0.2).item() == pytest.approx(0.0)


@pytest.mark.parametrize("loss", ["margin", "ce", "spread"])
def test_loss_switch_pairs_the_training_loss(loss):
    model = _tiny_capsnet(loss=loss, reconstruction="none")
    assert model.loss_kind == loss
    x, y = torch.rand(2, 1, 28, 28), torch.tensor([0, 2])
    out = model(x, target=y)
    expected = {"margin": margin_loss, "spread": spread_loss,
                "ce": torch.nn.functional.cross_entropy}[loss](out.scores, y)
    assert training_loss(model.loss_kind, out, x, y, 0.0).item() == pytest.approx(
        expected.item())
    with pytest.raises(CapsmedError, match="loss must be one of"):
        _tiny_capsnet(loss="hinge")


@pytest.mark.parametrize("layers, branches, paper_millions", [
    (3, 12, 73.2), (2, 1, 77.3), (2, 4, 77.6)])
def test_parallel_dr_counts_near_paper_001_table_1(layers, branches, paper_millions):
    # the stem widths are not in the paper; our reading lands within 6% (see docstring;
    # Table 1's 3-layer N=2 row is the non-parallel network, which parallel-dr is not)
    model = create_model("parallel-dr", in_channels=3, num_classes=15, input_size=400,
                         branches=branches, capsule_layers=layers)
    assert abs(count_parameters(model) / 1e6 - paper_millions) / paper_millions < 0.07


def test_parallel_dr_mid_capsule_is_the_unrouted_sum_of_votes():
    torch.manual_seed(3)
    model = create_model("parallel-dr", num_classes=3, in_channels=1, input_size=28,
                         **TINY["parallel-dr"])
    model.eval()
    x = torch.rand(2, 1, 28, 28)
    features = model.stem(x)
    primary = torch.stack([b(features) for b in model.branches], dim=1)  # B, N, I, D
    votes = torch.einsum("nidc,bnic->bnid", model.mid_weight, primary)  # explicit u_hat
    mid = squash(votes.sum(dim=2))  # a single output capsule: every coupling is 1
    expected, _ = dynamic_routing(
        torch.einsum("ijdc,bic->bijd", model.classes.weight, mid), 3)
    assert torch.allclose(model(x).capsules, expected, atol=1e-5)
    assert model.mid_weight.shape[:2] == (3, 4 * 4 * 2)  # branches, grid 4x4 x 2 per point


def test_parallel_dr_options():
    two = create_model("parallel-dr", num_classes=3, input_size=28, in_channels=1,
                       **{**TINY["parallel-dr"], "primary_dim": 12}, capsule_layers=2)
    assert two.branches[0].primary_dim == 4  # shortened by the 3 branches (paper 001)
    assert two.classes.weight.shape[0] == 3 * 32  # all primary capsules routed directly
    with pytest.raises(CapsmedError, match="capsule_layers must be 2, 3 or 4"):
        create_model("parallel-dr", capsule_layers=5)
    with pytest.raises(CapsmedError, match="branches must be >= 1"):
        create_model("parallel-dr", branches=0)


def test_recon_convnets_match_their_reading_of_paper_004():
    caps = count_parameters(create_model("capsnet"))
    # "the same number of parameters as in CapsNet": W_ij becomes FC(160), plus its bias
    assert count_parameters(create_model("convnet-cr")) == caps + 160
    assert count_parameters(create_model("convnet-cr-sf")) == caps + 160
    assert count_parameters(create_model("convnet-r")) == caps + 160 + 161 * 10
    torch.manual_seed(4)
    x, y1, y2 = torch.rand(2, 1, 28, 28), torch.tensor([0, 0]), torch.tensor([1, 1])
    cr = create_model("convnet-cr", num_classes=3, **TINY["convnet-cr"])
    out = cr(x, target=y1)
    assert cr.loss_kind == "margin"
    assert torch.allclose(out.scores, torch.sigmoid(out.capsules.sum(dim=-1)))
    assert not torch.allclose(out.reconstruction, cr(x, target=y2).reconstruction)
    r = create_model("convnet-r", num_classes=3, **TINY["convnet-r"])
    assert r.loss_kind == "ce"
    assert torch.allclose(r(x, target=y1).reconstruction, r(x, target=y2).reconstruction)
    sf = create_model("convnet-cr-sf", num_classes=3, **TINY["convnet-cr-sf"])
    scores = sf(x * 50).scores
    assert ((scores > 0) & (scores < 1)).all()
    assert torch.allclose(scores, sf(x * 50).capsules.norm(dim=-1), atol=1e-4)


def test_parallel_em_concatenates_branches_as_capsule_types():
    torch.manual_seed(5)
    three = create_model("parallel-em", num_classes=3, in_channels=1, input_size=32,
                         **TINY["parallel-em"])
    poses, acts = three.branches[0](three.stem(torch.rand(2, 1, 32, 32)))
    assert poses.shape[3] == 1 and acts.shape[3] == 1  # one mid capsule type per branch
    assert three.classes.weight.shape[0] == 2  # class layer sees N types
    out = three(torch.rand(2, 1, 32, 32), return_couplings=True)
    assert out.scores.shape == (2, 3) and ((out.scores > 0) & (out.scores < 1)).all()
    assert torch.allclose(out.couplings.sum(dim=-1), torch.ones_like(out.couplings[..., 0]),
                          atol=1e-5)
    two = create_model("parallel-em", num_classes=3, in_channels=1, input_size=64,
                       **TINY["parallel-em"], capsule_layers=2)
    assert two.classes.weight.shape[0] == 2 * 2  # 4 primary types split over 2 branches
    with pytest.raises(CapsmedError, match="grid of at least 3x3"):
        create_model("parallel-em", input_size=16, in_channels=1, **TINY["parallel-em"])
    with pytest.raises(CapsmedError, match="capsule_layers must be 2, 3 or 4"):
        create_model("parallel-em", capsule_layers=5)


def test_routing_em_switch_routes_vote_vectors_by_em():
    x = torch.rand(2, 1, 28, 28)
    em = _tiny_capsnet(routing="em", routing_iters=3)
    out = em(x, return_couplings=True)
    assert {"classes.beta_u", "classes.beta_a"} <= set(dict(em.named_parameters()))
    assert ((out.scores > 0) & (out.scores < 1)).all()  # EM activations, not lengths
    assert torch.allclose(out.couplings.sum(dim=2), torch.ones(2, 144), atol=1e-5)
    dynamic = _tiny_capsnet(routing="dynamic")
    dynamic.load_state_dict(em.state_dict(), strict=False)
    assert not torch.allclose(dynamic(x).scores, out.scores)
    training_loss(em.loss_kind, em(x, target=torch.tensor([0, 1])), x,
                  torch.tensor([0, 1]), 0.1).backward()
    assert em.classes.beta_a.grad is not None and em.classes.beta_a.grad.abs().sum() > 0


def test_four_capsule_layer_variants():
    x, y = torch.rand(2, 1, 64, 64), torch.tensor([0, 2])
    dr = create_model("parallel-dr", num_classes=3, in_channels=1, input_size=64,
                      **TINY["parallel-dr"], capsule_layers=4, mid_caps=3)
    assert dr.mid_weight.shape[2] == 3 and dr.last_weight.shape == (3, 3, 4, 4)
    em = create_model("parallel-em", num_classes=3, in_channels=1, input_size=64,
                      **TINY["parallel-em"], capsule_layers=4)
    assert [m.weight.shape[3] for m in em.branches[0].mids] == [4, 1]  # types -> 1
    assert [m.stride for m in em.branches[0].mids] == [2, 1]
    hinton = create_model("em-capsnet", num_classes=3, in_channels=1, input_size=64,
                          **TINY["em-capsnet"], capsule_layers=4)
    assert len(hinton.mids) == 2
    for model in (dr, em, hinton):
        out = model(x, target=y)
        assert out.scores.shape == (2, 3) and torch.isfinite(out.scores).all()
        training_loss(model.loss_kind, out, x, y, 0.0).backward()
        assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(CapsmedError, match="at least 7x7"):
        create_model("parallel-em", num_classes=3, in_channels=1, input_size=32,
                     **TINY["parallel-em"], capsule_layers=4)
