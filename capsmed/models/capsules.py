"""Capsule machinery shared by every capsule network: squash, routing, layers, decoder.

Shapes: ``B`` batch, ``I`` input capsules, ``J`` output capsules, ``D`` capsule length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from capsmed.errors import CapsmedError

EPS = 1e-8


def squash(s: torch.Tensor, dim: int = -1, eps: float = EPS) -> torch.Tensor:
    """Sabour et al. eq. 1: shrink a vector's length into [0, 1), keep its direction.

    ``v = |s|^2 / (1 + |s|^2) * s / |s|``; ``eps`` sits inside the square root so the
    gradient stays finite for a zero vector.
    """
    sq = (s * s).sum(dim=dim, keepdim=True)
    return s * (sq / (1.0 + sq) / torch.sqrt(sq + eps))


def capsule_length(v: torch.Tensor, dim: int = -1, eps: float = EPS) -> torch.Tensor:
    """Length of each capsule vector (its presence probability), safe at zero."""
    return torch.sqrt((v * v).sum(dim=dim) + eps)


def dynamic_routing(
    u_hat: torch.Tensor, iterations: int = 3, return_couplings: bool = False,
    squash_outputs: bool = True, eta: float = 1.0, grad_through_routing: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Routing by agreement (Sabour et al. 2017, procedure 1), vectorised.

    Args:
        u_hat: Prediction vectors [B, I, J, D] of each input capsule for each output.
        iterations: Number of times the outputs are computed; 1 = uniform couplings
            (no routing: every input sends 1/J of its vote to every output).
        return_couplings: Also return the final coupling coefficients [B, I, J].
        squash_outputs: Apply the squash non-linearity (paper 004's ``Squash-fn``).
        eta: Soft update rate (paper 003 eq. 3): ``c <- eta softmax(b) + (1 - eta) c``;
            1 is Sabour et al.'s rule, 0 keeps the couplings uniform.
        grad_through_routing: Backpropagate through every iteration's agreement; if
            False, only through the last weighted sum, with the couplings held constant
            (as Sabour et al.'s released code does).

    Returns:
        Output capsules v [B, J, D] and, optionally, the couplings.
    """
    if iterations < 1:
        raise ValueError("routing needs at least one iteration")
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"routing eta must be within [0, 1], got {eta}")
    # Routing is a tiny share of the compute but sensitive to precision: keep it fp32.
    with torch.autocast(device_type=u_hat.device.type, enabled=False):
        u_hat = u_hat.float()
        votes = u_hat if grad_through_routing else u_hat.detach()
        logits = u_hat.new_zeros(u_hat.shape[:3])
        # Softmax over the *output* capsules: each input distributes its vote.
        c = F.softmax(logits, dim=2)
        for it in range(iterations):
            if it > 0:
                c = eta * F.softmax(logits, dim=2) + (1.0 - eta) * c
            last = it == iterations - 1
            v = torch.einsum("bij,bijd->bjd", c, u_hat if last else votes)
            v = squash(v) if squash_outputs else v
            if not last:
                logits = logits + torch.einsum("bijd,bjd->bij", votes, v)
    return v, (c if return_couplings else None)


class PrimaryCapsules(nn.Module):
    """A convolution whose channels are grouped into ``types`` capsules of length ``dim``.

    Output: squashed capsules [B, types * H' * W', dim].
    """

    def __init__(self, in_channels: int, types: int, dim: int, kernel_size: int,
                 stride: int, squash: bool = True) -> None:
        super().__init__()
        self.types, self.dim, self.squash = types, dim, squash
        self.conv = nn.Conv2d(in_channels, types * dim, kernel_size, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, _, h, w = y.shape
        y = y.view(b, self.types, self.dim, h, w).permute(0, 1, 3, 4, 2)
        y = y.reshape(b, self.types * h * w, self.dim)
        return squash(y) if self.squash else y


class RoutedCapsules(nn.Module):
    """Fully connected capsule layer: transforms W_ij, then dynamic routing.

    Args:
        shared: One transform per output capsule, shared by every input capsule
            (Aff-CapsNet, paper 004) instead of one per (input, output) pair.
        iterations: Routing iterations; 1 = no routing (uniform couplings).
        squash: Squash the outputs.
        eta, grad_through_routing: See :func:`dynamic_routing`.
    """

    def __init__(self, in_caps: int, in_dim: int, out_caps: int, out_dim: int,
                 iterations: int = 3, shared: bool = False, squash: bool = True,
                 eta: float = 1.0, grad_through_routing: bool = True,
                 init_std: float = 0.05) -> None:
        super().__init__()
        if not 0.0 <= eta <= 1.0:
            raise CapsmedError(f"routing_eta must be within [0, 1], got {eta}")
        self.iterations, self.squash = iterations, squash
        self.eta, self.grad_through_routing = eta, grad_through_routing
        # W[i, j] maps input capsule i's pose to its prediction for output capsule j;
        # with shared transforms the input axis has length 1 and broadcasts.
        self.weight = nn.Parameter(
            init_std * torch.randn(1 if shared else in_caps, out_caps, out_dim, in_dim))

    def forward(self, u: torch.Tensor, return_couplings: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = self.weight.expand(u.shape[1], -1, -1, -1)  # a view: no copy when shared
        u_hat = torch.einsum("ijdc,bic->bijd", w, u)
        return dynamic_routing(u_hat, self.iterations, return_couplings, self.squash,
                               self.eta, self.grad_through_routing)


class MaskedDecoder(nn.Module):
    """Reconstruct the input from the class capsules.

    Conditional (Sabour et al.): all capsules but one are masked to zero, the true
    class during training, otherwise the longest. Plain (paper 004's "normal"
    reconstruction): every capsule is used, unmasked.
    """

    def __init__(self, num_caps: int, caps_dim: int, out_shape: tuple[int, int, int],
                 hidden: tuple[int, ...] = (512, 1024), conditional: bool = True) -> None:
        super().__init__()
        self.out_shape, self.conditional = out_shape, conditional
        sizes = [num_caps * caps_dim, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        c, h, w = out_shape
        layers += [nn.Linear(sizes[-1], c * h * w), nn.Sigmoid()]
        self.net = nn.Sequential(*layers)

    def forward(self, capsules: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        if self.conditional:
            mask = F.one_hot(keep, capsules.shape[1]).to(capsules.dtype)
            capsules = capsules * mask.unsqueeze(-1)
        return self.net(capsules.flatten(1)).view(-1, *self.out_shape)
