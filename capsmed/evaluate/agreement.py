"""Paper 001's agreement metric (Agr): same class in all eight basic orientations.

The eight orientations are the symmetries of the square: four rotations by 90 degrees,
each with and without a left-right flip. Flipping up-down is a left-right flip followed
by a 180-degree rotation, so paper 001's "flipped up-down and left-right" are in this
set. Agr is the share of images whose predicted class is the same in all eight,
whether or not it is correct; the accuracy in each orientation is reported beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from capsmed.progress import track

# torch.rot90 with dims (H, W) turns counter-clockwise as the image is displayed;
# "flip" is left-right and comes before the rotation.
ORIENTATIONS = ("identity", "rot90", "rot180", "rot270",
                "flip", "flip+rot90", "flip+rot180", "flip+rot270")


@dataclass(frozen=True)
class AgreementResult:
    """Agreement over the eight orientations and the accuracy in each.

    Attributes:
        agreement: Share of images given the same class in all eight orientations.
        accuracy: ``{orientation: accuracy}`` in :data:`ORIENTATIONS` order.
        samples: Number of images.
    """

    agreement: float
    accuracy: dict[str, float]
    samples: int

    @property
    def mean_accuracy(self) -> float:
        return float(np.mean(list(self.accuracy.values())))

    def to_dict(self) -> dict:
        return {"agreement": self.agreement, "accuracy_by_orientation": self.accuracy,
                "mean_accuracy": self.mean_accuracy, "samples": self.samples,
                "orientations": "4 rotations by 90 degrees x with/without left-right flip"}


def all_orientations(x: torch.Tensor) -> torch.Tensor:
    """The eight orientations of square images [B, C, H, W], stacked as [8, B, C, H, W]."""
    flipped = torch.flip(x, dims=(-1,))
    return torch.stack([torch.rot90(v, k, dims=(-2, -1)) for v in (x, flipped)
                        for k in range(4)])


@torch.no_grad()
def orientation_predictions(model: torch.nn.Module, images: np.ndarray,
                            device: torch.device, batch_size: int = 512,
                            disable_progress: bool | None = None) -> np.ndarray:
    """Predicted classes [8, N] of uint8 images [N, C, H, W] in every orientation.

    Each forward pass holds all eight orientations of ``batch_size // 8`` images, so
    memory stays that of an ordinary ``batch_size`` batch.
    """
    if images.shape[-1] != images.shape[-2]:
        raise ValueError(f"orientation agreement needs square images, got "
                         f"{images.shape[-2]}x{images.shape[-1]}")
    chunk = max(1, batch_size // len(ORIENTATIONS))
    preds = []
    starts = range(0, len(images), chunk)
    for start in track(starts, "orientations", disable=disable_progress):
        x = torch.from_numpy(images[start:start + chunk]).to(device).float().div_(255.0)
        views = all_orientations(x)  # [8, b, C, H, W]
        scores = model(views.flatten(0, 1)).scores
        preds.append(scores.argmax(dim=1).view(len(ORIENTATIONS), -1).cpu())
    if not preds:
        return np.empty((len(ORIENTATIONS), 0), dtype=np.int64)
    return torch.cat(preds, dim=1).numpy()


def agreement_from_predictions(preds: np.ndarray, labels: np.ndarray) -> AgreementResult:
    """Agr and per-orientation accuracy from predictions [8, N] and labels [N]."""
    n = preds.shape[1]
    if n == 0:
        raise ValueError("orientation agreement needs at least one image")
    same = (preds == preds[:1]).all(axis=0)
    accuracy = {name: float((preds[i] == labels).mean()) for i, name in enumerate(ORIENTATIONS)}
    return AgreementResult(agreement=float(same.mean()), accuracy=accuracy, samples=n)


def orientation_agreement(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray,
                          device: torch.device, batch_size: int = 512,
                          disable_progress: bool | None = None) -> AgreementResult:
    """Paper 001's Agr of ``model`` on uint8 images [N, C, H, W] with labels [N]."""
    preds = orientation_predictions(model, images, device, batch_size, disable_progress)
    return agreement_from_predictions(preds, np.asarray(labels))
