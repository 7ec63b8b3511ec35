"""Paper 004 section 3.3: ConvNets with CapsNet's reconstruction sub-network.

They isolate which CapsNet component gives semantic capsule representations. All
three share CapsNet's convolutions, Conv(256, 9, 1) + Conv(256, 9, 2), one FC layer
to ``num_classes * 16`` activations (the parameters of CapsNet's transformation
matrices), and CapsNet's decoder (FC 512-1024-CxHxW). Our reading of the text:

* ``convnet-cr``: the activations are grouped into one 16-vector per class. The sum of
  a group is its logit, and the sigmoid of the logit is the class probability. The
  decoder sees the groups with the class-conditional mask. The outputs are
  probabilities like capsule lengths, so it trains with the margin loss, as CapsNet.
* ``convnet-r``: an FC(num_classes) output layer on the same activations, with
  cross-entropy, and a decoder that sees all activations unmasked.
* ``convnet-cr-sf``: ConvNet-CR with the squash function. The feature maps are
  reshaped like primary capsules (32 types of 8-D) and squashed, and each class
  16-vector is squashed, so its length is the class probability (margin loss). The
  paper calls it equivalent to CapsNet without routing; unlike ``capsnet
  routing=none`` its FC layer has a bias and no 1/K coupling factor.
"""

from __future__ import annotations

import torch
from torch import nn

from capsmed.errors import CapsmedError
from capsmed.models.capsules import MaskedDecoder, capsule_length, squash
from capsmed.models.common import CapsmedModel, ModelOutput, Standardize, as_size
from capsmed.models.registry import register_model

GROUP = 16  # activations per class: the length of a CapsNet class capsule


class ReconConvNet(CapsmedModel):
    """Conv(256, 9, 1) + Conv(256, 9, 2) + FC(K*16) [+ squash], grouped or FC output,
    plus the reconstruction decoder."""

    def __init__(self, in_channels: int, num_classes: int, input_size: tuple[int, int],
                 variant: str, conv_channels: int, kernel_size: int, primary_dim: int,
                 decoder_hidden: tuple[int, ...], input_mean: list[float] | None,
                 input_std: list[float] | None) -> None:
        super().__init__()
        h, w = input_size
        gh, gw = ((s - kernel_size + 1 - kernel_size) // 2 + 1 for s in (h, w))
        if gh < 1 or gw < 1:
            need = 2 * kernel_size - 1
            raise CapsmedError(f"convnet-{variant} needs inputs of at least {need}x{need} "
                               f"pixels, got {h}x{w}")
        if variant == "cr-sf" and conv_channels % primary_dim:
            raise CapsmedError(f"conv_channels ({conv_channels}) must be a multiple of "
                               f"primary_dim ({primary_dim}) to form capsules")
        self.variant, self.primary_dim, self.num_classes = variant, primary_dim, num_classes
        self.loss_kind = "ce" if variant == "r" else "margin"
        self.standardize = Standardize(in_channels, input_mean, input_std)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, conv_channels, kernel_size), nn.ReLU(inplace=True),
            nn.Conv2d(conv_channels, conv_channels, kernel_size, stride=2))
        self.fc = nn.Linear(conv_channels * gh * gw, num_classes * GROUP)
        self.output = nn.Linear(num_classes * GROUP, num_classes) if variant == "r" else None
        self.decoder = MaskedDecoder(num_classes, GROUP, (in_channels, h, w), decoder_hidden,
                                     conditional=variant != "r")

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> ModelOutput:
        f = self.features(self.standardize(x))
        if self.variant == "cr-sf":  # primary-capsule-shaped vectors, squashed
            b, c, h, w = f.shape
            caps = f.view(b, c // self.primary_dim, self.primary_dim, h, w)
            f = squash(caps.permute(0, 1, 3, 4, 2), dim=-1).reshape(b, -1)
        else:
            f = torch.relu(f).flatten(1)
        groups = self.fc(f).view(-1, self.num_classes, GROUP)
        if self.variant == "cr-sf":
            groups = squash(groups)
            scores = capsule_length(groups)
        elif self.variant == "cr":
            scores = torch.sigmoid(groups.sum(dim=-1))
        else:
            scores = self.output(torch.relu(groups.flatten(1)))
        keep = target if target is not None else scores.argmax(dim=1)
        return ModelOutput(scores=scores, reconstruction=self.decoder(groups, keep),
                           capsules=groups)


def _build(variant: str, in_channels: int, num_classes: int,
           input_size: int | tuple[int, int], conv_channels: int, kernel_size: int,
           primary_dim: int, decoder_hidden: tuple[int, ...], input_mean: list[float] | None,
           input_std: list[float] | None) -> ReconConvNet:
    return ReconConvNet(in_channels, num_classes, as_size(input_size), variant, conv_channels,
                        kernel_size, primary_dim, tuple(decoder_hidden), input_mean, input_std)


@register_model("convnet-cr", paper="paper 004 section 3.3")
def convnet_cr(in_channels: int = 1, num_classes: int = 10,
               input_size: int | tuple[int, int] = 28, conv_channels: int = 256,
               kernel_size: int = 9, decoder_hidden: tuple[int, ...] = (512, 1024),
               input_mean: list[float] | None = None,
               input_std: list[float] | None = None) -> ReconConvNet:
    """ConvNet whose grouped FC outputs give sigmoid class probabilities; masked decoder."""
    return _build("cr", in_channels, num_classes, input_size, conv_channels, kernel_size, 8,
                  decoder_hidden, input_mean, input_std)


@register_model("convnet-r", paper="paper 004 section 3.3")
def convnet_r(in_channels: int = 1, num_classes: int = 10,
              input_size: int | tuple[int, int] = 28, conv_channels: int = 256,
              kernel_size: int = 9, decoder_hidden: tuple[int, ...] = (512, 1024),
              input_mean: list[float] | None = None,
              input_std: list[float] | None = None) -> ReconConvNet:
    """ConvNet-CR with an FC output layer and an unmasked decoder (cross-entropy)."""
    return _build("r", in_channels, num_classes, input_size, conv_channels, kernel_size, 8,
                  decoder_hidden, input_mean, input_std)


@register_model("convnet-cr-sf", paper="paper 004 section 3.3 (= CapsNet-NoR)")
def convnet_cr_sf(in_channels: int = 1, num_classes: int = 10,
                  input_size: int | tuple[int, int] = 28, conv_channels: int = 256,
                  kernel_size: int = 9, primary_dim: int = 8,
                  decoder_hidden: tuple[int, ...] = (512, 1024),
                  input_mean: list[float] | None = None,
                  input_std: list[float] | None = None) -> ReconConvNet:
    """ConvNet-CR with squashed primary-capsule-shaped features and squashed outputs."""
    return _build("cr-sf", in_channels, num_classes, input_size, conv_channels, kernel_size,
                  primary_dim, decoder_hidden, input_mean, input_std)
