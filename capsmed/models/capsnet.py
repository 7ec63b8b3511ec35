"""CapsNet (Sabour et al. 2017) as used in paper 000 (Jimenez-Sanchez et al. 2018).

Table 1: Conv 256 9x9 -> primary capsules (32 types of 8-D capsules from a 256-channel
9x9 stride-2 convolution: 32x6x6 = 1152 capsules at 28x28) -> one 16-D capsule per
class by dynamic routing (3 iterations) -> masked decoder FC 512-1024-(C*H*W).
At 28x28, 1 channel, 10 classes this has 8,215,568 parameters (paper: 8.2M).
"""

from __future__ import annotations

import torch
from torch import nn

from capsmed.errors import CapsmedError
from capsmed.models.capsules import MaskedDecoder, PrimaryCapsules, RoutedCapsules, capsule_length
from capsmed.models.common import ModelOutput, Standardize, as_size
from capsmed.models.registry import register_model


class CapsNet(nn.Module):
    """Conv -> primary capsules -> routed class capsules (+ masked decoder)."""

    loss_kind = "margin"

    def __init__(self, in_channels: int, num_classes: int, input_size: tuple[int, int],
                 conv_channels: int, conv_kernel: int, primary_types: int, primary_dim: int,
                 primary_kernel: int, class_dim: int, routing_iters: int,
                 decoder_hidden: tuple[int, ...] | None,
                 input_mean: list[float] | None = None,
                 input_std: list[float] | None = None) -> None:
        super().__init__()
        h, w = input_size
        self.standardize = Standardize(in_channels, input_mean, input_std)
        gh = (h - conv_kernel + 1 - primary_kernel) // 2 + 1
        gw = (w - conv_kernel + 1 - primary_kernel) // 2 + 1
        if gh < 1 or gw < 1:
            need = conv_kernel + primary_kernel - 1
            raise CapsmedError(f"capsnet needs inputs of at least {need}x{need} pixels "
                               f"(conv {conv_kernel} + primary {primary_kernel}), got {h}x{w}")
        self.conv = nn.Sequential(nn.Conv2d(in_channels, conv_channels, conv_kernel),
                                  nn.ReLU(inplace=True))
        self.primary = PrimaryCapsules(conv_channels, primary_types, primary_dim,
                                       primary_kernel, stride=2)
        self.classes = RoutedCapsules(primary_types * gh * gw, primary_dim, num_classes,
                                      class_dim, routing_iters)
        self.decoder = (MaskedDecoder(num_classes, class_dim, (in_channels, h, w),
                                      decoder_hidden) if decoder_hidden is not None else None)
        for m in self.modules():  # paper 000: Xavier initialisation of the convolutions
            if isinstance(m, nn.Conv2d):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None,
                return_couplings: bool = False) -> ModelOutput:
        u = self.primary(self.conv(self.standardize(x)))
        v, couplings = self.classes(u, return_couplings)
        scores = capsule_length(v)
        recon = None
        if self.decoder is not None:
            keep = target if target is not None else scores.argmax(dim=1)
            recon = self.decoder(v, keep)
        return ModelOutput(scores=scores, reconstruction=recon, capsules=v,
                           couplings=couplings)


@register_model("capsnet", paper="Sabour et al. 2017; paper 000 Table 1 (8.2M at 28x28)")
def capsnet(in_channels: int = 1, num_classes: int = 10,
            input_size: int | tuple[int, int] = 28, conv_channels: int = 256,
            conv_kernel: int = 9, primary_types: int = 32, primary_dim: int = 8,
            primary_kernel: int = 9, class_dim: int = 16, routing_iters: int = 3,
            decoder_hidden: tuple[int, ...] | None = (512, 1024),
            input_mean: list[float] | None = None,
            input_std: list[float] | None = None) -> CapsNet:
    """Sabour et al. CapsNet: dynamic routing, margin loss, masked reconstruction decoder."""
    return CapsNet(in_channels, num_classes, as_size(input_size), conv_channels, conv_kernel,
                   primary_types, primary_dim, primary_kernel, class_dim, routing_iters,
                   tuple(decoder_hidden) if decoder_hidden is not None else None,
                   input_mean, input_std)
