"""Losses: margin loss + masked reconstruction for capsule networks, cross-entropy otherwise."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from capsmed.data.loader import TwoLabels
from capsmed.errors import CapsmedError
from capsmed.models.common import LOSS_KINDS, ModelOutput


def _weighted_mean(per_sample: torch.Tensor, target: torch.Tensor,
                   class_weights: torch.Tensor | None) -> torch.Tensor:
    if class_weights is None:
        return per_sample.mean()
    return (per_sample * class_weights[target]).mean()


def margin_loss(lengths: torch.Tensor, target: torch.Tensor, m_pos: float = 0.9,
                m_neg: float = 0.1, lam: float = 0.5,
                class_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Paper 000 eq. 1 (Sabour et al.): summed over classes, averaged over the batch.

    ``L_k = T_k max(0, m+ - |v_k|)^2 + lam (1 - T_k) max(0, |v_k| - m-)^2``; with
    ``class_weights`` each sample's loss is scaled by the weight of its class.
    """
    t = F.one_hot(target, lengths.shape[1]).to(lengths.dtype)
    present = t * F.relu(m_pos - lengths) ** 2
    absent = lam * (1.0 - t) * F.relu(lengths - m_neg) ** 2
    return _weighted_mean((present + absent).sum(dim=1), target, class_weights)


def spread_loss(scores: torch.Tensor, target: torch.Tensor, margin: float = 0.9,
                class_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Hinton et al. 2018: ``sum_{i != t} max(0, margin - (a_t - a_i))^2``, batch mean.

    The true class's activation must exceed every other by ``margin``.
    """
    a_t = scores.gather(1, target[:, None])
    gaps = F.relu(margin - (a_t - scores)) ** 2
    gaps = gaps * (1.0 - F.one_hot(target, scores.shape[1]).to(scores.dtype))
    return _weighted_mean(gaps.sum(dim=1), target, class_weights)


def reconstruction_loss(reconstruction: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """Squared error summed over pixels, averaged over the batch.

    With Sabour et al.'s weight 0.0005 this equals paper 000 eq. 2's per-pixel mean
    scaled by 0.0005 * H * W (0.392 at 28x28), the scaling both papers' code used.
    """
    return ((reconstruction.float() - images.float()) ** 2).flatten(1).sum(dim=1).mean()


def balanced_class_weights(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``N / (K n_c)`` per class, K counting the classes present (1 for an absent
    class): each class then weighs as much as in a balanced set, and the weights of
    the N samples still sum to N."""
    counts = torch.bincount(labels, minlength=num_classes).float()
    present = (counts > 0).sum()
    return torch.where(counts > 0, len(labels) / (present * counts.clamp(min=1)), 1.0)


def training_loss(loss_kind: str, output: ModelOutput, images: torch.Tensor,
                  target: torch.Tensor, recon_weight: float,
                  class_weights: torch.Tensor | None = None) -> torch.Tensor:
    """The loss a model is trained with: its ``loss_kind`` on the class scores, plus the
    weighted reconstruction loss whenever the model reconstructs.

    For capsule networks ``ce`` is the cross-entropy of a softmax over capsule lengths
    (our reading of paper 004's "CE Loss" ablation).
    """
    scores = output.scores.float()
    if loss_kind == "margin":
        loss = margin_loss(scores, target, class_weights=class_weights)
    elif loss_kind == "ce":
        loss = _weighted_mean(F.cross_entropy(scores, target, reduction="none"), target,
                              class_weights)
    elif loss_kind == "spread":
        loss = spread_loss(scores, target, class_weights=class_weights)
    else:
        raise ValueError(f"unknown loss kind {loss_kind!r} (choose from {LOSS_KINDS})")
    if output.reconstruction is not None and recon_weight > 0:
        loss = loss + recon_weight * reconstruction_loss(output.reconstruction, images)
    return loss


TWO_LABEL_LOSSES = ("margin", "ce")  # what two_label_loss knows


def two_label_loss(loss_kind: str, output: ModelOutput, target: TwoLabels, recon_weight: float,
                   decoder: torch.nn.Module | None, images: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """Sabour et al.'s MultiMNIST loss: both classes present (margin loss with two
    targets; binary cross-entropy on a multi-hot target for ConvNets), and each object
    reconstructed from its own class capsule against its own source image. An unmasked
    decoder (``reconstruction=plain``, convnet-r) sees every capsule at once: it
    reconstructs the whole input ``images``, both objects (scored against each object
    in turn, it learnt their average)."""
    scores = output.scores.float()
    k = scores.shape[1]
    t = (F.one_hot(target.first, k) + F.one_hot(target.second, k)).clamp(max=1).float()
    if loss_kind == "margin":
        loss = (t * F.relu(0.9 - scores) ** 2
                + 0.5 * (1.0 - t) * F.relu(scores - 0.1) ** 2).sum(dim=1).mean()
    elif loss_kind == "ce":
        loss = F.binary_cross_entropy_with_logits(scores, t, reduction="none").sum(1).mean()
    else:
        raise CapsmedError(f"two-label training supports {' and '.join(TWO_LABEL_LOSSES)} "
                           f"losses, not '{loss_kind}'")
    if recon_weight > 0 and output.reconstruction is not None and decoder is not None \
            and not getattr(decoder, "conditional", True):
        if images is not None:
            loss = loss + recon_weight * reconstruction_loss(output.reconstruction, images)
    elif (recon_weight > 0 and output.reconstruction is not None and decoder is not None
            and target.image_a is not None and target.image_b is not None):
        # the decoder's weights are fp32 and this call is outside the forward pass's
        # autocast: capsules an autocast layer made (bf16 / fp16) would not fit them
        second = decoder(output.capsules.float(), target.second)
        loss = loss + recon_weight * (reconstruction_loss(output.reconstruction, target.image_a)
                                      + reconstruction_loss(second, target.image_b))
    return loss


def count_correct(scores: torch.Tensor, target: torch.Tensor | TwoLabels) -> torch.Tensor:
    """Correct predictions in a batch: the top class, or for two labels both top-2
    classes (MultiMNIST's two-digit accuracy)."""
    if isinstance(target, TwoLabels):
        top2 = scores.topk(2, dim=1).indices
        hit = ((top2 == target.first[:, None]).any(1)
               & (top2 == target.second[:, None]).any(1))
        return hit.sum()
    return (scores.argmax(1) == target).sum()
