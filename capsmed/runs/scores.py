"""What a run's model says about images: raw class scores in batches, and the one
documented per-class score that evaluate's AUC, predict's CSV, heatmaps and GeoJSON and
an exported model all give (:func:`class_probabilities`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from scipy.special import softmax

from capsmed.errors import CapsmedError


@torch.no_grad()
def predict_scores(model: torch.nn.Module, images: np.ndarray, device: torch.device,
                   batch_size: int = 512) -> np.ndarray:
    """Class scores [N, K] for uint8 images [N, C, H, W]."""
    out = []
    for start in range(0, len(images), batch_size):
        # contiguous: a strided view (HWC read as CHW) takes other kernels, other roundings
        chunk = np.ascontiguousarray(images[start:start + batch_size])
        x = torch.from_numpy(chunk).to(device).float().div_(255.0)
        out.append(model(x).scores.float().cpu())
    return torch.cat(out).numpy() if out else np.empty((0, 0), dtype=np.float32)


def non_finite_rows(scores: np.ndarray) -> int:
    """How many images [N, K] scores give a NaN or infinite score to some class."""
    scores = np.asarray(scores)
    return int((~np.isfinite(scores)).any(axis=1).sum()) if scores.size else 0


def refuse_non_finite(bad: int, total: int, checkpoint: Path, what: str) -> None:
    """Refuse scores with NaN or inf (``bad`` of ``total`` ``what``): the highest score
    of such an image is an arbitrary class, so no prediction or report is made from
    them. Training stops on a non-finite loss, so such weights are likely corrupt."""
    if bad:
        raise CapsmedError(f"{checkpoint}: the model gives NaN or infinite class scores for "
                           f"{bad} of {total} {what} (training stops on a non-finite "
                           "loss: the weights are likely corrupt or replaced)")


def class_probabilities(scores: np.ndarray, loss_kind: str) -> tuple[np.ndarray, str]:
    """Per-class scores to rank samples by for AUC, and how they were obtained.

    ConvNets trained with cross-entropy output logits: their probabilities are the
    softmax. Capsule networks (margin loss) output capsule lengths and the EM networks
    (spread loss) class activations: each is already the model's own probability of
    its class, trained independently of the others, so it is used as is. One-vs-rest
    AUC ranks the samples by one class's score, so renormalising the lengths to sum to
    one would mix the other classes' evidence into that ranking.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if loss_kind == "ce":
        return softmax(scores, axis=1), "softmax of the logits"
    return scores, "class capsule lengths / activations, unnormalised"
