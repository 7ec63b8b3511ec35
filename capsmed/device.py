"""Which device runs the work, its name in reports, and seeding: used by every stage."""

from __future__ import annotations

import platform

import numpy as np
import torch

from capsmed.errors import CapsmedError


def select_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA, then Apple MPS, then CPU; anything else is passed to torch."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise CapsmedError(f"unknown device '{name}' ({exc})") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CapsmedError(f"device '{name}' requested but CUDA is not available here")
    return device


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"cpu ({platform.processor() or platform.machine()}, "\
               f"{torch.get_num_threads()} threads)"
    return str(device)
