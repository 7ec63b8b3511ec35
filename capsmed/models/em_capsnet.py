"""Matrix capsules with EM routing (Hinton, Sabour & Frosst 2018) and paper 001's EM-CapsNet.

Reading of paper 001 (Vigueras-Guillen et al. 2021, sections 1.1 and 2.1-2.2):
every capsule is a 4x4 pose matrix plus an activation; there are 32 Primary-Caps types;
convolutional capsules see a KxK window (K=3, stride 2 for the Mid-Caps, K=1 for the
Class-Caps); "coordinate addition is not employed"; the loss is Hinton et al.'s spread
loss; the CNN blocks before the capsules are "an adapted single block of ResNeXt"; EM
networks "were unable to converge when the image was only reduced to 50x50 before
entering the capsule section". The best EM network has 2 capsule layers (Primary ->
Class); the 3-layer one inserts Mid-Caps.

Choices (everything the paper leaves open is a switch of the ``em-capsnet`` builder):

* Stem: 7x7/2 convolution (``stem_channels``) + BN + ReLU, then ``stem_blocks``
  :class:`~capsmed.models.resnext.ResNeXtBlock` of stride 2 whose width doubles per block
  as in ResNeXt's stages (planes ``stem_channels * 2**i``, output ``planes * 4``).
  ``stem_blocks=3`` by default: a 400x400 image reaches the capsules at 25x25, the
  first size below paper 001's failing 50x50 (one block would leave 100x100); at
  the default 64x64 the primary grid is 4x4. The grid is ``ceil(n / 2**(1 + stem_blocks))``.
* ``coordinate_addition=False`` by default, as paper 001 states; True gives Hinton et
  al.'s class layer.
* Paper 001 Table 1 lists 3.6M (2 layers) and 3.1M (3 layers, 2 Mid-Caps) parameters,
  but never specifies the stem (channels, number of blocks), which holds almost all
  of them, so those counts cannot be matched. That the 3-layer network is smaller
  suggests its 2-layer network has one more CNN block ("duplicated to allow another
  stride", section 2.1): ``stem_blocks=4``. Our defaults give, for 15 classes,
  2,378,110 (2 layers) and 2,525,630 (3 layers, ``mid_types=32``) parameters at any
  input size, 400x400 included (weights are shared over the grid); ``stem_blocks=4``
  gives 8,485,246 and 8,632,766.
* EM routing (:func:`em_routing`) follows Hinton et al.'s procedure 1. As Gritzman
  (2019, "Avoiding implementation pitfalls of matrix capsule networks"), the routing
  mass ``sum_i R_ij a_i`` entering the cost is rescaled by ``COST_REFERENCE_INPUTS *
  N_out / N_in`` (= 100 * N_out / N_in), so that a class layer fed by a 25x25 grid and
  a 3x3 convolutional layer see the same cost scale (Hinton et al.'s smallNORB class
  layer had 512 inputs for 5 outputs, ~100 each, the regime its lambda = 0.01 was set
  for). The inverse temperature grows as ``lambda_t = final_lambda * (1 -
  0.95**(t+1))`` for t = 0..T-1 (a geometric ramp; ``final_lambda`` is its asymptote,
  the last of 3 iterations uses 0.14 of it). With the ramp rescaled to end at
  ``final_lambda``, the class activations of the untrained default network saturated
  (up to 1 - 1e-4); with this one they start within 0.5-0.8 (2 layers) and 0.84-0.99
  (3 layers).
* Convolutional capsules route each output position independently: an input capsule
  in overlapping windows splits its vote over the output types of each window, not
  across neighbouring windows (as most implementations; Hinton et al. leave it open).
* Transform matrices start as N(0, 0.5^2): a vote entry sums 4 products, so it keeps the
  pose's variance. Betas start at 0 (activations near 0.5). Stem convolutions use He
  initialisation, the primary 1x1 convolutions Xavier.
"""

from __future__ import annotations

import torch
from torch import nn

from capsmed.errors import CapsmedError
from capsmed.models.capsules import em_routing
from capsmed.models.common import CapsmedModel, ModelOutput, Standardize, as_size
from capsmed.models.registry import register_model
from capsmed.models.resnext import capsule_stem, stem_grid


# Inputs per output the cost is normalised to (Gritzman 2019; see module docstring).
def _transforms(*shape: int) -> nn.Parameter:
    # A vote entry sums 4 products pose x weight: std 0.5 keeps the pose's variance.
    return nn.Parameter(torch.randn(*shape) * 0.5)


class PrimaryMatrixCapsules(nn.Module):
    """1x1 convolutions to ``types`` pose matrices and sigmoid activations per position.

    Input [B, C, H, W]; output poses [B, H, W, types, pose*pose] and activations
    [B, H, W, types].
    """

    def __init__(self, in_channels: int, types: int, pose: int = 4) -> None:
        super().__init__()
        self.types, self.pose_len = types, pose * pose
        self.poses = nn.Conv2d(in_channels, types * self.pose_len, 1)
        self.activations = nn.Conv2d(in_channels, types, 1)
        for conv in (self.poses, self.activations):
            nn.init.xavier_uniform_(conv.weight)
            nn.init.zeros_(conv.bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, _, h, w = x.shape
        poses = self.poses(x).permute(0, 2, 3, 1).reshape(b, h, w, self.types, self.pose_len)
        acts = torch.sigmoid(self.activations(x)).permute(0, 2, 3, 1)
        return poses, acts


class ConvMatrixCapsules(nn.Module):
    """Convolutional capsules: EM routing from each KxK window of input capsules.

    One ``pose x pose`` transform per (kernel position, input type, output type), shared
    across the grid. No padding, so the grid goes from H to ``(H - kernel) // stride + 1``.
    """

    def __init__(self, in_types: int, out_types: int, kernel: int, stride: int,
                 iterations: int, final_lambda: float = 0.01, pose: int = 4) -> None:
        super().__init__()
        self.kernel, self.stride, self.pose = kernel, stride, pose
        self.iterations, self.final_lambda = iterations, final_lambda
        self.weight = _transforms(kernel, kernel, in_types, out_types, pose, pose)
        self.beta_u = nn.Parameter(torch.zeros(out_types))
        self.beta_a = nn.Parameter(torch.zeros(out_types))

    def forward(self, poses: torch.Tensor, acts: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        b, k, s, p = poses.shape[0], self.kernel, self.stride, self.pose
        # unfold(dim, size, step) appends the window axis: [B, Ho, Wo, I, P, K, K].
        win = poses.unfold(1, k, s).unfold(2, k, s)
        ho, wo, i = win.shape[1], win.shape[2], win.shape[3]
        win = win.permute(0, 1, 2, 5, 6, 3, 4).reshape(b, ho, wo, k, k, i, p, p)
        a_win = acts.unfold(1, k, s).unfold(2, k, s).permute(0, 1, 2, 4, 5, 3)
        votes = torch.einsum("bhwxyiac,xyiocd->bhwxyioad", win, self.weight)
        o = votes.shape[6]
        # Every output position is its own routing problem over K*K*I inputs.
        pose_out, a_out, _ = em_routing(votes.reshape(b * ho * wo, k * k * i, o, p * p),
                                        a_win.reshape(b * ho * wo, k * k * i), self.beta_u,
                                        self.beta_a, self.iterations, self.final_lambda)
        return pose_out.view(b, ho, wo, o, p * p), a_out.view(b, ho, wo, o)


class ClassMatrixCapsules(nn.Module):
    """Class capsules: every grid capsule votes through one transform per (type, class).

    Coordinate addition (Hinton et al. section 4): the centre of each input capsule's
    grid cell, ``((row + 0.5) / H, (col + 0.5) / W)`` in [0, 1], is added to entries
    (0, pose-1) and (1, pose-1) of its vote matrix (the first two of the last column),
    so poses keep where their parts were although the transforms are shared.
    """

    def __init__(self, in_types: int, num_classes: int, iterations: int,
                 coordinate_addition: bool, final_lambda: float = 0.01, pose: int = 4) -> None:
        super().__init__()
        self.pose, self.iterations, self.final_lambda = pose, iterations, final_lambda
        self.coordinate_addition = coordinate_addition
        self.weight = _transforms(in_types, num_classes, pose, pose)
        self.beta_u = nn.Parameter(torch.zeros(num_classes))
        self.beta_a = nn.Parameter(torch.zeros(num_classes))

    def forward(self, poses: torch.Tensor, acts: torch.Tensor, return_couplings: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        b, h, w, i, _ = poses.shape
        p = self.pose
        votes = torch.einsum("bhwiac,ikcd->bhwikad", poses.view(b, h, w, i, p, p), self.weight)
        if self.coordinate_addition:
            rows = (torch.arange(h, device=votes.device, dtype=votes.dtype) + 0.5) / h
            cols = (torch.arange(w, device=votes.device, dtype=votes.dtype) + 0.5) / w
            offset = votes.new_zeros(h, w, 1, 1, p, p)
            offset[:, :, 0, 0, 0, p - 1] = rows[:, None]
            offset[:, :, 0, 0, 1, p - 1] = cols[None, :]
            votes = votes + offset
        k = votes.shape[4]
        return em_routing(votes.reshape(b, h * w * i, k, p * p), acts.reshape(b, h * w * i),
                          self.beta_u, self.beta_a, self.iterations, self.final_lambda,
                          return_couplings)


class EMCapsNet(CapsmedModel):
    """ResNeXt stem -> Primary-Caps -> (Mid-Caps 3x3/2) -> Class-Caps, EM routing."""

    layers_in_order = False  # residual shortcuts / parallel branches

    returns_couplings = True

    loss_kind = "spread"

    def __init__(self, in_channels: int, num_classes: int, input_size: tuple[int, int], *,
                 stem_channels: int, stem_blocks: int, cardinality: int, base_width: int,
                 primary_types: int, mid_types: int, capsule_layers: int, routing_iters: int,
                 final_lambda: float, coordinate_addition: bool, pose: int,
                 input_mean: list[float] | None, input_std: list[float] | None) -> None:
        super().__init__()
        if pose < 2:
            raise CapsmedError(f"pose must be >= 2 (a pose x pose matrix), got {pose}")
        if capsule_layers not in (2, 3, 4):
            raise CapsmedError(f"capsule_layers must be 2, 3 or 4, got {capsule_layers}")
        if routing_iters < 1:
            raise CapsmedError(f"routing_iters must be >= 1, got {routing_iters}")
        if final_lambda <= 0:
            raise CapsmedError(f"final_lambda must be > 0, got {final_lambda}")
        for name, value in (("stem_channels", stem_channels), ("primary_types", primary_types),
                            ("mid_types", mid_types), ("cardinality", cardinality),
                            ("num_classes", num_classes)):
            if value < 1:
                raise CapsmedError(f"{name} must be >= 1, got {value}")
        if stem_blocks < 0:
            raise CapsmedError(f"stem_blocks must be >= 0, got {stem_blocks}")
        if stem_blocks and int(stem_channels * base_width / 64) < 1:
            raise CapsmedError(f"stem_channels * base_width must be >= 64 for a ResNeXt "
                               f"block, got {stem_channels} * {base_width}")
        h, w = input_size
        # primary grid that the mid layers' 3x3 windows need: 3 for one 3x3/2 layer,
        # 7 for 3x3/2 then 3x3/1 (Hinton et al.'s four capsule layers)
        need = {2: 1, 3: 3, 4: 7}[capsule_layers]
        if min(stem_grid(h, stem_blocks), stem_grid(w, stem_blocks)) < need:
            least = (need - 1) * 2 ** (1 + stem_blocks) + 1
            raise CapsmedError(f"em-capsnet with capsule_layers={capsule_layers} and "
                               f"stem_blocks={stem_blocks} needs inputs of at least "
                               f"{least}x{least} pixels, got {h}x{w}")
        self.standardize = Standardize(in_channels, input_mean, input_std)
        self.stem, channels = capsule_stem(
            in_channels, stem_channels, tuple(stem_channels * 2 ** i for i in range(stem_blocks)),
            cardinality, base_width)
        self.primary = PrimaryMatrixCapsules(channels, primary_types, pose)
        mids = []
        if capsule_layers >= 3:
            mids.append(ConvMatrixCapsules(primary_types, mid_types, 3, 2, routing_iters,
                                           final_lambda, pose))
        if capsule_layers == 4:
            mids.append(ConvMatrixCapsules(mid_types, mid_types, 3, 1, routing_iters,
                                           final_lambda, pose))
        self.mids = nn.ModuleList(mids)
        self.classes = ClassMatrixCapsules(primary_types if not mids else mid_types,
                                           num_classes, routing_iters, coordinate_addition,
                                           final_lambda, pose)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None,
                return_couplings: bool = False) -> ModelOutput:
        poses, acts = self.primary(self.stem(self.standardize(x)))
        for mid in self.mids:
            poses, acts = mid(poses, acts)
        pose, scores, couplings = self.classes(poses, acts, return_couplings)
        return ModelOutput(scores=scores, capsules=pose, couplings=couplings)


@register_model("em-capsnet", paper="Hinton et al. 2018; paper 001 2-layer EM network")
def em_capsnet(in_channels: int = 3, num_classes: int = 15,
               input_size: int | tuple[int, int] = 64, stem_channels: int = 64,
               stem_blocks: int = 3, cardinality: int = 32, base_width: int = 4,
               primary_types: int = 32, mid_types: int = 32, capsule_layers: int = 2,
               routing_iters: int = 3, final_lambda: float = 0.01,
               coordinate_addition: bool = False, pose: int = 4,
               input_mean: list[float] | None = None,
               input_std: list[float] | None = None) -> EMCapsNet:
    """Matrix capsules with EM routing after a ResNeXt stem; spread loss; no decoder.

    ``pose`` is the side of the pose matrices: 3, 4 or 5 gives paper 001's capsule
    sizes 9, 16 and 25.
    """
    return EMCapsNet(in_channels, num_classes, as_size(input_size),
                     stem_channels=stem_channels, stem_blocks=stem_blocks,
                     cardinality=cardinality, base_width=base_width,
                     primary_types=primary_types, mid_types=mid_types,
                     capsule_layers=capsule_layers, routing_iters=routing_iters,
                     final_lambda=final_lambda, coordinate_addition=coordinate_addition,
                     pose=pose, input_mean=input_mean, input_std=input_std)
