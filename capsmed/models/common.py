"""What every model's forward returns, so the trainer treats all families alike."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelOutput:
    """Forward result.

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
