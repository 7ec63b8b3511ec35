"""Optimisers and learning-rate schedules used by the papers."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from capsmed.train.choices import OPTIMIZERS, SCHEDULES


def build_optimizer(name: str, params: Iterable[torch.nn.Parameter], lr: float
                    ) -> torch.optim.Optimizer:
    """Adam (papers 000, 004) or Nadam (paper 001).

    On CUDA, Adam is the fused implementation (one kernel for every parameter instead
    of a few per tensor: the same update, and the step stays capturable in a CUDA
    graph); Nadam has no fused kernel and uses the multi-tensor (foreach) one.
    """
    params = list(params)
    on_cuda = bool(params) and all(p.is_cuda for p in params)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, fused=True if on_cuda else None)
    if name == "nadam":
        return torch.optim.NAdam(params, lr=lr, foreach=True if on_cuda else None)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


def build_schedule(name: str, optimizer: torch.optim.Optimizer, decay: float
                   ) -> torch.optim.lr_scheduler.LRScheduler:
    """Per-epoch schedule: constant, or exponential decay by ``decay`` each epoch (the
    exponential schedule of Sabour et al.'s released code, stepped per epoch here)."""
    if name == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 1.0)
    if name == "exponential":
        return torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=decay)
    raise ValueError(f"lr schedule must be one of {SCHEDULES}, got {name!r}")
