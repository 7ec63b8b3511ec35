"""A textbook CapsNet, the yardstick for ``gpu_check.py``'s speed-up ratio.

Written as public PyTorch CapsNets are (Sabour et al. 2017, paper 000 Table 1): the
[B, 1152, 10, 16] prediction vectors by one matmul, then a routing loop of separate
softmax, weighted-sum, squash and agreement operations on them, eager fp32, a plain
(unfused) Adam. Same shapes and parameter count as ``capsmed``'s ``capsnet``, so the
two can be timed side by side in one process; it is never used for training.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn


def squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    sq = (s ** 2).sum(dim=dim, keepdim=True)
    return sq / (1 + sq) * s / torch.sqrt(sq + 1e-8)


class ReferenceCapsNet(nn.Module):
    """Conv 256 9x9 -> 32x6x6 8-D primary capsules -> 10 16-D capsules -> decoder."""

    def __init__(self, classes: int = 10, routing_iters: int = 3) -> None:
        super().__init__()
        self.routing_iters = routing_iters
        self.conv1 = nn.Conv2d(1, 256, 9)
        self.primary = nn.Conv2d(256, 32 * 8, 9, stride=2)
        self.W = nn.Parameter(0.05 * torch.randn(1, 32 * 6 * 6, classes, 16, 8))
        self.decoder = nn.Sequential(nn.Linear(16 * classes, 512), nn.ReLU(),
                                     nn.Linear(512, 1024), nn.ReLU(),
                                     nn.Linear(1024, 784), nn.Sigmoid())

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.relu(self.conv1(x))
        u = self.primary(h).view(x.shape[0], 32, 8, 6, 6).permute(0, 1, 3, 4, 2)
        u = squash(u.reshape(x.shape[0], -1, 8))
        u_hat = (self.W @ u[:, :, None, :, None]).squeeze(-1)  # [B, 1152, 10, 16]
        b = torch.zeros(u_hat.shape[:3], device=x.device)
        for it in range(self.routing_iters):
            c = F.softmax(b, dim=2)
            s = (c.unsqueeze(-1) * u_hat).sum(dim=1)
            v = squash(s)
            if it < self.routing_iters - 1:
                b = b + (u_hat * v.unsqueeze(1)).sum(dim=-1)
        lengths = v.norm(dim=-1)
        mask = F.one_hot(y, v.shape[1]).float().unsqueeze(-1)
        recon = self.decoder((v * mask).flatten(1))
        return lengths, recon


def reference_loss(lengths: torch.Tensor, recon: torch.Tensor, x: torch.Tensor,
                   y: torch.Tensor) -> torch.Tensor:
    t = F.one_hot(y, lengths.shape[1]).float()
    margin = (t * F.relu(0.9 - lengths) ** 2 + 0.5 * (1 - t) * F.relu(lengths - 0.1) ** 2)
    return margin.sum(1).mean() + 5e-4 * ((recon - x.flatten(1)) ** 2).sum(1).mean()


def time_reference(batch_size: int, device: torch.device, steps: int = 20,
                   warmup: int = 5) -> float:
    """Training images/s of the textbook CapsNet (fp32 eager) at ``batch_size``."""
    torch.manual_seed(0)
    model = ReferenceCapsNet().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    x = torch.rand(batch_size, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch_size,), device=device)

    def step() -> None:
        optimizer.zero_grad()
        reference_loss(*model(x, y), x, y).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return steps * batch_size / (time.perf_counter() - started)
