"""Parallel capsule networks (paper 001, Vigueras-Guillen et al. 2021): DR and EM.

``parallel-em`` is documented on :class:`ParallelEMCapsNet`. For ``parallel-dr``:

Our reading of paper 001 section 2.1 and Fig. 1, for the 3-capsule-layer DR network:

* a shared CNN stem: conv 7x7/2 (``stem_channels``) then ``len(stem_planes)`` ResNeXt
  blocks, each halving the resolution and doubling the channels (the configuration
  of the authors' later public code);
* ``branches`` parallel branches, each with its own ResNeXt block (stride 2) and its
  own primary capsules: ``caps_per_point`` capsules of ``primary_dim`` elements per
  grid point (paper: "256 elements long, two capsules per grid-point"), squashed;
* one 16-D mid capsule per branch. Its transforms W_i are *not* shared across the grid
  (paper: so a useless primary capsule can be discarded by zeroing its W_i). With a
  single output there is nothing to route: s = sum_i W_i u_i, computed as one einsum
  without materialising the [B, I, 16] prediction vectors, which keeps 64-400 px
  inputs within memory;
* the N mid capsules, concatenated, are routed by dynamic routing to 16-D class
  capsules (margin loss, as the original authors).

``capsule_layers=2`` drops the mid capsules: every branch's primary capsules
(``primary_dim // branches`` long, as paper 001 shortens them) are concatenated and
routed to the class capsules directly. ``capsule_layers=4``: paper 001 says only that
it "performs the merging before the Class-Caps", i.e. each branch owns every capsule
layer but the class layer. Here a branch routes its primary capsules (non-shared
transforms) to ``mid_caps`` 16-D capsules, and those to its single last capsule. The
paper gives no sizes and reports that this network did not converge.

Paper 001 does not state the stem and branch widths. With the defaults here (stem
planes 32 and 64, branch planes 128, 1x1 primary convolution), at 400x400x3 with
15 classes, the parallel networks and the 2-layer DR entries of its Table 1 are within
6%:

    layers  N   here      paper
    3       12  68.95M    73.2M
    2       1   77.53M    77.3M
    2       4   78.58M    77.6M

(Table 1's 3-layer N=2 row, 11.3M, is the non-parallel network with 2 routed
Mid-Caps, which this class does not build: one Mid-Cap per branch. Its parallel
3-layer N=2 has 11.59M; the paper gives no parallel N=2 count.)
"""

from __future__ import annotations

import torch
from torch import nn

from capsmed.errors import CapsmedError
from capsmed.models.capsules import RoutedCapsules, dynamic_routing, squash
from capsmed.models.common import CapsmedModel, ModelOutput, Standardize, as_size
from capsmed.models.em_capsnet import (
    ClassMatrixCapsules,
    ConvMatrixCapsules,
    PrimaryMatrixCapsules,
)
from capsmed.models.registry import register_model
from capsmed.models.resnext import ResNeXtBlock, capsule_stem, stem_grid


class Branch(nn.Module):
    """One branch: its own ResNeXt block, then primary capsules [B, G*G*caps, dim]."""

    def __init__(self, in_channels: int, planes: int, caps_per_point: int, primary_dim: int,
                 primary_kernel: int, cardinality: int, base_width: int) -> None:
        super().__init__()
        self.block = ResNeXtBlock(in_channels, planes, 2, cardinality, base_width)
        self.primary = nn.Conv2d(self.block.out_channels, caps_per_point * primary_dim,
                                 primary_kernel, padding=primary_kernel // 2)
        self.caps_per_point, self.primary_dim = caps_per_point, primary_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.primary(self.block(x))
        b, _, h, w = y.shape
        y = y.view(b, self.caps_per_point, self.primary_dim, h, w).permute(0, 3, 4, 1, 2)
        return squash(y.reshape(b, h * w * self.caps_per_point, self.primary_dim))


class ParallelDRCapsNet(CapsmedModel):
    """Shared stem -> N branches (CNN block + primary capsules [+ one mid capsule]) ->
    dynamic routing to class capsules."""

    layers_in_order = False  # residual shortcuts / parallel branches

    returns_couplings = True

    loss_kind = "margin"

    def __init__(self, in_channels: int, num_classes: int, input_size: tuple[int, int], *,
                 branches: int, capsule_layers: int, stem_channels: int,
                 stem_planes: tuple[int, ...], branch_planes: int, cardinality: int,
                 base_width: int, caps_per_point: int, primary_dim: int, primary_kernel: int,
                 mid_caps: int, mid_dim: int, class_dim: int, routing_iters: int,
                 input_mean: list[float] | None, input_std: list[float] | None) -> None:
        super().__init__()
        if branches < 1:
            raise CapsmedError(f"branches must be >= 1, got {branches}")
        if capsule_layers not in (2, 3, 4):
            raise CapsmedError(f"capsule_layers must be 2, 3 or 4, got {capsule_layers}")
        if mid_caps < 1:
            raise CapsmedError(f"mid_caps must be >= 1, got {mid_caps}")
        if routing_iters < 0:  # RoutedCapsules would quietly run a negative count as 1
            raise CapsmedError(f"routing_iters must be >= 0, got {routing_iters}")
        if capsule_layers == 2:  # paper 001: primary capsules shortened by the branch count
            primary_dim = max(4, primary_dim // branches)
        h, w = input_size
        grid = [stem_grid(s, len(stem_planes) + 1) for s in (h, w)]  # + the branch block
        self.standardize = Standardize(in_channels, input_mean, input_std)
        self.stem, channels = capsule_stem(in_channels, stem_channels, stem_planes,
                                           cardinality, base_width)
        self.branches = nn.ModuleList(
            Branch(channels, branch_planes, caps_per_point, primary_dim, primary_kernel,
                   cardinality, base_width) for _ in range(branches))
        primary_caps = grid[0] * grid[1] * caps_per_point
        self.capsule_layers, self.routing_iters = capsule_layers, routing_iters
        if capsule_layers == 4:
            # W[n, i, a]: primary capsule i of branch n -> mid capsule a of that branch
            # (non-shared, as the 3-layer network), then each branch's mid capsules ->
            # its single last capsule
            self.mid_weight = nn.Parameter(
                0.05 * torch.randn(branches, primary_caps, mid_caps, mid_dim, primary_dim))
            self.last_weight = nn.Parameter(
                0.05 * torch.randn(branches, mid_caps, mid_dim, mid_dim))
        if capsule_layers == 3:
            # W[n, i]: primary capsule i of branch n -> that branch's single mid capsule
            self.mid_weight = nn.Parameter(
                0.05 * torch.randn(branches, primary_caps, mid_dim, primary_dim))
        if capsule_layers >= 3:
            self.classes = RoutedCapsules(branches, mid_dim, num_classes, class_dim,
                                          iterations=routing_iters)
        else:
            self.classes = RoutedCapsules(branches * primary_caps, primary_dim, num_classes,
                                          class_dim, iterations=routing_iters)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None,
                return_couplings: bool = False) -> ModelOutput:
        features = self.stem(self.standardize(x))
        primary = torch.stack([branch(features) for branch in self.branches], dim=1)
        if self.capsule_layers == 3:
            # One output per branch: coupling 1, so the mid capsule is the plain sum of
            # the votes, contracted directly (no [B, N, I, 16] vote tensor).
            mid = squash(torch.einsum("nidc,bnic->bnd", self.mid_weight, primary))
            v, scores, couplings = self.classes(mid, return_couplings)
        elif self.capsule_layers == 4:
            b, n = primary.shape[:2]
            votes = torch.einsum("niadc,bnic->bniad", self.mid_weight, primary)
            mid, _ = dynamic_routing(votes.flatten(0, 1), self.routing_iters)  # per branch
            last = squash(torch.einsum("nadc,bnac->bnd", self.last_weight,
                                       mid.view(b, n, *mid.shape[1:])))
            v, scores, couplings = self.classes(last, return_couplings)
        else:
            v, scores, couplings = self.classes(primary.flatten(1, 2), return_couplings)
        return ModelOutput(scores=scores, capsules=v, couplings=couplings)


@register_model("parallel-dr", paper="paper 001 (best: 12 branches, 3 capsule layers)")
def parallel_dr(in_channels: int = 3, num_classes: int = 15,
                input_size: int | tuple[int, int] = 128, branches: int = 12,
                capsule_layers: int = 3, stem_channels: int = 64,
                stem_planes: tuple[int, ...] = (32, 64), branch_planes: int = 128,
                cardinality: int = 32, base_width: int = 4, caps_per_point: int = 2,
                primary_dim: int = 256, primary_kernel: int = 1, mid_caps: int = 2,
                mid_dim: int = 16, class_dim: int = 16, routing_iters: int = 3,
                input_mean: list[float] | None = None,
                input_std: list[float] | None = None) -> ParallelDRCapsNet:
    """Parallel DR-CapsNet: shared ResNeXt stem, N branches with one mid capsule each."""
    return ParallelDRCapsNet(
        in_channels, num_classes, as_size(input_size), branches=branches,
        capsule_layers=capsule_layers, stem_channels=stem_channels,
        stem_planes=tuple(stem_planes), branch_planes=branch_planes,
        cardinality=cardinality, base_width=base_width, caps_per_point=caps_per_point,
        primary_dim=primary_dim, primary_kernel=primary_kernel, mid_caps=mid_caps,
        mid_dim=mid_dim,
        class_dim=class_dim, routing_iters=routing_iters, input_mean=input_mean,
        input_std=input_std)


class EMBranch(nn.Module):
    """One EM branch: its own ResNeXt block(s), primary matrix capsules and its mid
    capsule layers: none (2 capsule layers), a 3x3/2 layer to one type (3), or 3x3/2
    to ``types`` types then 3x3/1 to one type (4)."""

    def __init__(self, in_channels: int, planes: int, blocks: int, types: int,
                 mid_layers: int, routing_iters: int, final_lambda: float, cardinality: int,
                 base_width: int, pose: int) -> None:
        super().__init__()
        layers = []
        for _ in range(blocks):
            block = ResNeXtBlock(in_channels, planes, 2, cardinality, base_width)
            layers.append(block)
            in_channels = block.out_channels
        self.blocks = nn.Sequential(*layers)
        self.primary = PrimaryMatrixCapsules(in_channels, types, pose)
        shapes = {0: [], 1: [(types, 1, 2)], 2: [(types, types, 2), (types, 1, 1)]}
        self.mids = nn.ModuleList(ConvMatrixCapsules(i, o, 3, stride, routing_iters,
                                                     final_lambda, pose)
                                  for i, o, stride in shapes[mid_layers])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        poses, acts = self.primary(self.blocks(x))
        for mid in self.mids:
            poses, acts = mid(poses, acts)
        return poses, acts


class ParallelEMCapsNet(CapsmedModel):
    """Paper 001's parallel EM-CapsNet: shared stem -> N branches -> class capsules.

    Three capsule layers (paper 001 Fig. 1, top): per branch 32 primary capsule types
    and one mid capsule type (window 3x3, stride 2); the branches' mid capsules are
    concatenated as capsule types and EM-routed to the class capsules (window 1x1:
    one transform per type and class shared over the grid). No coordinate addition.
    Two capsule layers: the primary types are split evenly among the branches (a
    ``primary_types`` the branch count does not divide is refused), which are
    concatenated before the class capsules, and each branch repeats its CNN block for
    the stride the mid capsules no longer provide. Four capsule layers (paper 001:
    "performs the merging before the Class-Caps", i.e. each branch owns every capsule
    layer but the class layer): primary -> 3x3/2 to ``primary_types`` types -> 3x3/1 to
    one type, per branch. The paper gives no sizes and reports poor results for it.

    Paper 001 Table 1 gives 30.1M parameters for N=10 (3 layers) and 4.6M for N=2
    (2 layers); the defaults here give 19.95M and 8.12M at 400x400x3. Nearly all of
    the parameters are in the CNN blocks, whose widths the paper does not state.
    """

    layers_in_order = False  # residual shortcuts / parallel branches

    returns_couplings = True

    loss_kind = "spread"

    def __init__(self, in_channels: int, num_classes: int, input_size: tuple[int, int], *,
                 branches: int, capsule_layers: int, stem_channels: int,
                 stem_planes: tuple[int, ...], branch_planes: int, cardinality: int,
                 base_width: int, primary_types: int, routing_iters: int,
                 final_lambda: float, pose: int, input_mean: list[float] | None,
                 input_std: list[float] | None) -> None:
        super().__init__()
        if branches < 1:
            raise CapsmedError(f"branches must be >= 1, got {branches}")
        if capsule_layers not in (2, 3, 4):
            raise CapsmedError(f"capsule_layers must be 2, 3 or 4, got {capsule_layers}")
        # as em-capsnet: a lambda <= 0 fixes or inverts every activation, pose 1 is no matrix
        if final_lambda <= 0:
            raise CapsmedError(f"final_lambda must be > 0, got {final_lambda}")
        if pose < 2:
            raise CapsmedError(f"pose must be >= 2 (a pose x pose matrix), got {pose}")
        if capsule_layers == 2 and primary_types % branches:
            # the split would round: 32 types over 10 branches built 30 (over 40, 40)
            raise CapsmedError(f"parallel-em with 2 capsule layers splits the "
                               f"primary_types evenly among the branches: {primary_types} "
                               f"types cannot be split over {branches} branches; give a "
                               "primary_types that branches divides")
        types = primary_types if capsule_layers > 2 else primary_types // branches
        blocks = 2 if capsule_layers == 2 else 1
        h, w = input_size
        grid = [stem_grid(s, len(stem_planes) + blocks) for s in (h, w)]
        need = {2: 1, 3: 3, 4: 7}[capsule_layers]  # for the mid layers' 3x3 windows
        if min(grid) < need:
            raise CapsmedError(f"parallel-em with {capsule_layers} capsule layers needs a "
                               f"primary capsule grid of at least {need}x{need} for the mid "
                               f"capsules' windows; {h}x{w} gives {grid[0]}x{grid[1]}: use "
                               "larger inputs")
        self.standardize = Standardize(in_channels, input_mean, input_std)
        self.stem, channels = capsule_stem(in_channels, stem_channels, stem_planes,
                                           cardinality, base_width)
        self.branches = nn.ModuleList(
            EMBranch(channels, branch_planes, blocks, types, capsule_layers - 2,
                     routing_iters, final_lambda, cardinality, base_width, pose)
            for _ in range(branches))
        self.classes = ClassMatrixCapsules(branches * (types if capsule_layers == 2 else 1),
                                           num_classes, routing_iters, False, final_lambda,
                                           pose)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None,
                return_couplings: bool = False) -> ModelOutput:
        features = self.stem(self.standardize(x))
        outputs = [branch(features) for branch in self.branches]
        poses = torch.cat([p for p, _ in outputs], dim=3)  # branches become capsule types
        acts = torch.cat([a for _, a in outputs], dim=3)
        pose, scores, couplings = self.classes(poses, acts, return_couplings)
        return ModelOutput(scores=scores, capsules=pose, couplings=couplings)


@register_model("parallel-em", paper="paper 001 (best: 10 branches, 3 capsule layers)")
def parallel_em(in_channels: int = 3, num_classes: int = 15,
                input_size: int | tuple[int, int] = 128, branches: int = 10,
                capsule_layers: int = 3, stem_channels: int = 64,
                stem_planes: tuple[int, ...] = (64, 128), branch_planes: int = 256,
                cardinality: int = 32, base_width: int = 4, primary_types: int = 32,
                routing_iters: int = 3, final_lambda: float = 0.01, pose: int = 4,
                input_mean: list[float] | None = None,
                input_std: list[float] | None = None) -> ParallelEMCapsNet:
    """Parallel EM-CapsNet: shared ResNeXt stem, N branches with one mid capsule type each."""
    return ParallelEMCapsNet(
        in_channels, num_classes, as_size(input_size), branches=branches,
        capsule_layers=capsule_layers, stem_channels=stem_channels,
        stem_planes=tuple(stem_planes), branch_planes=branch_planes,
        cardinality=cardinality, base_width=base_width, primary_types=primary_types,
        routing_iters=routing_iters, final_lambda=final_lambda, pose=pose,
        input_mean=input_mean, input_std=input_std)
