"""LeNet as compared in paper 000: two 5x5 convolutions (6, 16) with 2x2 max pools,
FC 120, FC 84, then the class layer. The first convolution pads by 2 (LeNet-5 on
28x28 MNIST), giving 61,706 parameters at 28x28/10 classes (paper: ~60K).
"""

from __future__ import annotations

import torch
from torch import nn

from capsmed.errors import CapsmedError
from capsmed.models.common import CapsmedModel, ModelOutput, Standardize, as_size
from capsmed.models.registry import register_model


class LeNet(CapsmedModel):
    """LeNet-5 with ReLU activations and max pooling."""

    loss_kind = "ce"

    def __init__(self, in_channels: int, num_classes: int, input_size: tuple[int, int],
                 widths: tuple[int, int], hidden: tuple[int, ...],
                 input_mean: list[float] | None = None,
                 input_std: list[float] | None = None) -> None:
        super().__init__()
        if len(widths) != 2:  # two convolutions: a third width would be dropped unseen
            raise CapsmedError(f"lenet widths must be two numbers (its two convolutions), "
                               f"got {list(widths)}")
        self.standardize = Standardize(in_channels, input_mean, input_std)
        h, w = input_size
        fh, fw = (h // 2 - 4) // 2, (w // 2 - 4) // 2
        if fh < 1 or fw < 1:
            raise CapsmedError(f"lenet needs inputs of at least 12x12 pixels, got {h}x{w}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 5, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(widths[0], widths[1], 5), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        )
        sizes = [widths[1] * fh * fw, *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        layers.append(nn.Linear(sizes[-1], num_classes))
        self.classifier = nn.Sequential(*layers)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> ModelOutput:
        return ModelOutput(scores=self.classifier(self.features(self.standardize(x))))


@register_model("lenet", paper="LeCun et al. 1998; paper 000 Table 1 (~60K at 28x28)")
def lenet(in_channels: int = 1, num_classes: int = 10, input_size: int | tuple[int, int] = 28,
          widths: tuple[int, int] = (6, 16), hidden: tuple[int, ...] = (120, 84),
          input_mean: list[float] | None = None, input_std: list[float] | None = None) -> LeNet:
    """LeNet-5: conv 6 and 16 (5x5) with 2x2 pools, FC 120-84, cross-entropy."""
    return LeNet(in_channels, num_classes, as_size(input_size), tuple(widths), tuple(hidden),
                 input_mean, input_std)
