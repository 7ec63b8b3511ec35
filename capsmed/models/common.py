"""What every architecture shares: the forward result, input standardisation, sizes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from capsmed.errors import CapsmedError

# The losses a model can declare as its ``loss_kind``; capsmed.train.losses implements them.
LOSS_KINDS = ("margin", "ce", "spread")


@dataclass
class ModelOutput:
    """Forward result, the same for every family so the trainer treats them alike.

    Attributes:
        scores: [B, K] class scores: capsule lengths in [0, 1] for capsule networks
            (``loss_kind == "margin"``), logits for ConvNets (``loss_kind == "ce"``).
        reconstruction: [B, C, H, W] decoder output in [0, 1], when the model has one.
        capsules: [B, K, D] class capsule vectors, for capsule networks.
        couplings: routing coupling coefficients, when requested.
    """

    scores: torch.Tensor
    reconstruction: torch.Tensor | None = None
    capsules: torch.Tensor | None = None
    couplings: torch.Tensor | None = None


class CapsmedModel(nn.Module):
    """What every registered architecture provides; the trainer, evaluation and the
    analyses rely on exactly this (checked over the registry by a test).

    Attributes:
        loss_kind: One of :data:`LOSS_KINDS`; the trainer pairs the loss with it.
        decoder: The reconstruction decoder over the class capsules, or None.
        returns_couplings: ``forward(..., return_couplings=True)`` fills
            :attr:`ModelOutput.couplings` (routing coefficients; capsule networks).
        layers_in_order: Its parameters are registered in the order the forward pass
            uses them, one path (no branches or shortcuts), so "the first k layers" can
            be read off them (``capsmed analyze transfer``).

    ``forward(x, target=None, **kwargs) -> ModelOutput``: ``x`` is [B, C, H, W] in
    [0, 1]; ``target`` (class indices) picks the capsule the decoder reconstructs.
    """

    loss_kind: str = "ce"
    decoder: nn.Module | None  # an instance attribute (see __init__), never a class one
    returns_couplings: bool = False
    layers_in_order: bool = True

    def __init__(self) -> None:
        super().__init__()
        # Set here, not as a class attribute: a class-level None would shadow the
        # decoder module a subclass registers (nn.Module keeps submodules apart).
        self.decoder = None


class Standardize(nn.Module):
    """``(x - mean) / std`` per channel; identity when no statistics are given.

    Models receive images in [0, 1] (what the reconstruction decoder must reproduce)
    and standardise them first. The trainer fills ``mean``/``std`` from the training
    split, so they are saved with the model's arguments in ``checkpoint.json``.
    """

    def __init__(self, channels: int, mean: Sequence[float] | None,
                 std: Sequence[float] | None) -> None:
        super().__init__()
        if (mean is None) != (std is None):  # one alone would be dropped without a word
            raise ValueError("input_mean and input_std go together: give both or neither")
        self.enabled = mean is not None and std is not None
        mean = list(mean) if mean is not None else [0.0] * channels
        std = list(std) if std is not None else [1.0] * channels
        # checked on plain values, so models can also be built on the meta device
        if len(mean) != channels or len(std) != channels or min(std) <= 0:
            raise ValueError(f"input_mean/input_std need {channels} values (std > 0)")
        # an infinite std scales every pixel to 0: a model that sees nothing, trained
        if not all(math.isfinite(v) for v in (*mean, *std)):
            raise ValueError(f"input_mean/input_std must be finite, got {mean} and {std}")
        m = torch.tensor(mean, dtype=torch.float32)
        s = torch.tensor(std, dtype=torch.float32)
        # Non-persistent: the values live in the model's arguments, not its weights.
        self.register_buffer("mean", m.view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", s.view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Checked here, every model's first layer: with statistics, a 1-channel batch
        # would broadcast against a 3-channel mean into an RGB-shaped tensor, and
        # uint8 pixels (0-255) would come out as floats, both then classified silently.
        channels = self.mean.shape[1]
        if x.dim() != 4 or x.shape[1] != channels or not x.is_floating_point():
            raise CapsmedError(f"the model takes float images [N, {channels}, H, W] in "
                               f"[0, 1], got {str(x.dtype).removeprefix('torch.')} "
                               f"{list(x.shape)}")
        return (x - self.mean) / self.std if self.enabled else x


def as_size(input_size: int | Sequence[int]) -> tuple[int, int]:
    """Normalise an ``input_size`` argument (int or [H, W]) to (H, W)."""
    if isinstance(input_size, int):
        return (input_size, input_size)
    h, w = input_size
    return (int(h), int(w))
