"""ResNeXt (Xie et al. 2017): the reusable bottleneck block and ResNeXt-50 (32x4d).

Paper 001 compares its parallel capsule networks against ResNeXt-50 and builds their
shared stem from ResNeXt blocks, so :class:`ResNeXtBlock` is public. ResNeXt-50 32x4d
here is the standard network: a 7x7/2 stem with 3x3/2 max pooling, stages of 3, 4, 6
and 3 bottleneck blocks (cardinality 32, width 4 per group), global average pooling
and a class layer. That gives 23,010,639 parameters for 15 classes (paper 001: ~23M;
25,028,904 with 1,000 classes, as the reference implementation).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from capsmed.models.common import CapsmedModel, ModelOutput, Standardize, as_size
from capsmed.models.registry import register_model


class ResNeXtBlock(nn.Module):
    """Bottleneck with grouped 3x3 convolution: 1x1 -> 3x3 (groups) -> 1x1, plus skip.

    Args:
        in_channels: Input channels.
        planes: Stage width; the block outputs ``planes * expansion`` channels.
        stride: Stride of the grouped convolution (2 halves the resolution).
        cardinality: Number of groups.
        base_width: Channels per group at ``planes == 64``.
    """

    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int = 1, cardinality: int = 32,
                 base_width: int = 4) -> None:
        super().__init__()
        width = int(planes * base_width / 64) * cardinality
        out_channels = planes * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, width, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, groups=cardinality,
                      bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels))
        self.skip = (nn.Identity() if stride == 1 and in_channels == out_channels else
                     nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride,
                                             bias=False), nn.BatchNorm2d(out_channels)))
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnext_stage(in_channels: int, planes: int, blocks: int, stride: int, cardinality: int,
                  base_width: int) -> nn.Sequential:
    """``blocks`` ResNeXt blocks; the first one changes resolution and width."""
    layers = []
    for i in range(blocks):
        block = ResNeXtBlock(in_channels, planes, stride if i == 0 else 1, cardinality,
                             base_width)
        layers.append(block)
        in_channels = block.out_channels
    return nn.Sequential(*layers)


def stem_grid(size: int, stride2_blocks: int) -> int:
    """Side of the feature grid after :func:`capsule_stem`'s 7x7/2 convolution and
    ``stride2_blocks`` stride-2 ResNeXt blocks (each padded, so each rounds up)."""
    return math.ceil(size / 2 ** (1 + stride2_blocks))


def capsule_stem(in_channels: int, stem_channels: int, planes: tuple[int, ...],
                 cardinality: int, base_width: int) -> tuple[nn.Sequential, int]:
    """The CNN stem of paper 001's capsule networks: conv 7x7/2 + BN + ReLU, then one
    stride-2 ResNeXt block per entry of ``planes``.

    Returns:
        The stem and its number of output channels.
    """
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, stem_channels, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(stem_channels), nn.ReLU(inplace=True)]
    channels = stem_channels
    for width in planes:
        block = ResNeXtBlock(channels, width, 2, cardinality, base_width)
        layers.append(block)
        channels = block.out_channels
    stem = nn.Sequential(*layers)
    for m in stem.modules():  # He initialisation, as ResNeXt
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return stem, channels


class ResNeXt(CapsmedModel):
    """Stem, four ResNeXt stages, global average pooling, class layer."""

    layers_in_order = False  # residual shortcuts / parallel branches

    loss_kind = "ce"

    def __init__(self, in_channels: int, num_classes: int, layers: tuple[int, ...],
                 planes: tuple[int, ...], cardinality: int, base_width: int,
                 stem_channels: int, input_mean: list[float] | None,
                 input_std: list[float] | None) -> None:
        super().__init__()
        self.standardize = Standardize(in_channels, input_mean, input_std)
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, stem_channels, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(stem_channels), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1))
        stages, channels = [], stem_channels
        for i, (blocks, width) in enumerate(zip(layers, planes, strict=True)):
            stage = resnext_stage(channels, width, blocks, 1 if i == 0 else 2, cardinality,
                                  base_width)
            stages.append(stage)
            channels = stage[-1].out_channels
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(channels, num_classes))
        for m in self.modules():  # He initialisation, as the reference implementation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> ModelOutput:
        return ModelOutput(scores=self.head(self.stages(self.stem(self.standardize(x)))))


@register_model("resnext50", paper="Xie et al. 2017; paper 001 baseline (~23M, 15 classes)")
def resnext50(in_channels: int = 3, num_classes: int = 15,
              input_size: int | tuple[int, int] = 128, layers: tuple[int, ...] = (3, 4, 6, 3),
              planes: tuple[int, ...] = (64, 128, 256, 512), cardinality: int = 32,
              base_width: int = 4, stem_channels: int = 64,
              input_mean: list[float] | None = None,
              input_std: list[float] | None = None) -> ResNeXt:
    """ResNeXt-50 32x4d with batch norm; works at any input size (global pooling)."""
    as_size(input_size)  # any size works; validated for a uniform vocabulary
    return ResNeXt(in_channels, num_classes, tuple(layers), tuple(planes), cardinality,
                   base_width, stem_channels, input_mean, input_std)
