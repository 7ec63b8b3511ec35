"""What the class capsules encode, seen through the reconstruction decoder.

* Reconstruction grid (paper 000 Fig. 3): test images beside their reconstructions from
  the predicted class's capsule, a few samples per class.
* Perturbation grids (Sabour et al. section 5.1; the dimension study of paper 002): for
  one sample per class, each dimension of its predicted class capsule is shifted by
  every value in [-0.25, 0.25] (11 steps of 0.05) while the others are kept, and the
  decoder draws the result; one row per dimension.

Both need a model with a :class:`~capsmed.models.capsules.MaskedDecoder` (``.decoder``)
whose forward output carries the class capsules [B, K, D] (CapsNet, Aff-CapsNet and
paper 004's ConvNet-CR/-R/-CR-SF); other models are skipped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from capsmed.evaluate.plots import plot_image_grid
from capsmed.models.capsules import MaskedDecoder

log = logging.getLogger(__name__)

RECONSTRUCTIONS_PNG = "reconstructions.png"
# a grid whose largest pixel change is below this is drawn as its autoscaled changes
VISIBLE_CHANGE = 0.1
FLAT = 1e-6  # no change at all: said in the title


@dataclass(frozen=True)
class PerturbationGrid:
    """Decoded images [D, S, C, H, W] for each capsule dimension and shift."""

    class_index: int
    sample_index: int
    predicted: int
    shifts: np.ndarray
    images: np.ndarray


def capsule_decoder(model: torch.nn.Module) -> MaskedDecoder | None:
    """The model's reconstruction decoder, or None when it has none."""
    decoder = model.decoder
    return decoder if isinstance(decoder, MaskedDecoder) else None


def first_per_class(labels: np.ndarray, num_classes: int, per_class: int) -> np.ndarray:
    """Indices of the first ``per_class`` samples of each class, class by class."""
    picks = [np.flatnonzero(labels == k)[:per_class] for k in range(num_classes)]
    return np.concatenate(picks).astype(np.int64) if picks else np.empty(0, np.int64)


@torch.no_grad()
def _forward(model: torch.nn.Module, images: np.ndarray, device: torch.device):
    x = torch.from_numpy(images).to(device).float().div_(255.0)
    return x, model(x)


@torch.no_grad()
def perturb_dimensions(decoder: MaskedDecoder, capsules: torch.Tensor, class_index: int,
                       shifts: np.ndarray) -> np.ndarray:
    """Decode one sample's class capsules [K, D] with each dimension of ``class_index``
    shifted by each value in ``shifts``; returns [D, S, C, H, W] in [0, 1]."""
    k, d = capsules.shape
    s = len(shifts)
    batch = capsules.unsqueeze(0).repeat(d * s, 1, 1)  # [D*S, K, D]
    delta = torch.as_tensor(shifts, dtype=capsules.dtype, device=capsules.device)
    rows = torch.arange(d, device=capsules.device).repeat_interleave(s)
    batch[torch.arange(d * s), class_index, rows] += delta.repeat(d)
    keep = torch.full((d * s,), class_index, dtype=torch.long, device=capsules.device)
    return decoder(batch, keep).view(d, s, *decoder.out_shape).float().cpu().numpy()


def capsule_grids(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray,
                  num_classes: int, device: torch.device, per_class: int = 4,
                  steps: int = 11, span: float = 0.25
                  ) -> tuple[dict, list[PerturbationGrid]] | None:
    """Reconstructions and perturbation grids for a few samples of each class.

    Returns:
        None when the model has no decoder or no class capsules; otherwise the
        reconstruction samples (``inputs``, ``reconstructions``, ``labels``,
        ``predicted``) and one :class:`PerturbationGrid` per class present.
    """
    decoder = capsule_decoder(model)
    if decoder is None:
        return None
    index = first_per_class(labels, num_classes, per_class)
    if not len(index):
        return None
    x, out = _forward(model, images[index], device)
    if out.reconstruction is None or out.capsules is None or out.capsules.dim() != 3:
        return None
    predicted = out.scores.argmax(dim=1).cpu().numpy()
    recon = {"inputs": x.cpu().numpy(), "reconstructions": out.reconstruction.float().cpu()
             .numpy(), "labels": labels[index], "predicted": predicted}
    shifts = np.linspace(-span, span, steps)
    grids = []
    for k in range(num_classes):
        mine = np.flatnonzero(labels[index] == k)
        if not len(mine):
            continue
        right = mine[predicted[mine] == k]  # prefer a sample the model gets right
        j = int(right[0] if len(right) else mine[0])
        grids.append(PerturbationGrid(
            class_index=k, sample_index=int(index[j]), predicted=int(predicted[j]),
            shifts=shifts,
            images=perturb_dimensions(decoder, out.capsules[j], int(predicted[j]), shifts)))
    return recon, grids


def perturbation_filename(class_index: int, class_name: str) -> str:
    """``perturbation-01-mitosis.png``: index first, so odd class names never collide."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", class_name).strip("-") or "class"
    return f"perturbation-{class_index:02d}-{slug}.png"


def remove_capsule_grids(out_dir: Path) -> None:
    """Delete grids an earlier evaluation left, so ``report/`` describes one evaluation."""
    for stale in [*Path(out_dir).glob("perturbation-*.png"), Path(out_dir) / RECONSTRUCTIONS_PNG]:
        stale.unlink(missing_ok=True)


def perturbation_view(grid: PerturbationGrid) -> tuple[np.ndarray, str]:
    """What to draw of a grid, and a line saying what it shows.

    An undertrained decoder barely reacts to its capsule: its decodes are one grey
    square repeated, which shows nothing. Below :data:`VISIBLE_CHANGE` the grid is drawn
    as each image's change from the unshifted decode, scaled so the largest change is
    full contrast (grey: no change); a grid with no change at all says so.
    """
    centre = grid.images[:, int(np.argmin(np.abs(grid.shifts)))]
    change = grid.images - centre[:, None]
    spread = float(np.abs(change).max()) if change.size else 0.0
    if spread >= VISIBLE_CHANGE:
        return grid.images, "decoded images"
    if spread <= FLAT:
        return grid.images, ("flat: no shift changes any pixel (the decoder does not use "
                             "this capsule yet, e.g. an undertrained run)")
    return (0.5 + change / (2 * spread),
            f"change from the unshifted decode, scaled: full contrast = ±{spread:.2g} "
            "(grey: no change; the decodes alone look alike)")


def write_capsule_grids(recon: dict, grids: Sequence[PerturbationGrid],
                        class_names: Sequence[str], out_dir: Path) -> list[Path]:
    """Plot the reconstruction grid and the perturbation grids into ``out_dir``."""
    out_dir = Path(out_dir)
    remove_capsule_grids(out_dir)
    labels, predicted = recon["labels"], recon["predicted"]
    rows, row_names, wrong = [], [], []
    for k, name in enumerate(class_names):
        mine = np.flatnonzero(labels == k)
        if not len(mine):
            continue
        pairs = [im for j in mine for im in (recon["inputs"][j], recon["reconstructions"][j])]
        rows.append(pairs)
        row_names.append(name)
        wrong.append([bool(predicted[j] != k) for j in mine])
    width = max(len(r) for r in rows)
    column_names = ["input", "recon"] * (width // 2)
    marks = [(i, 2 * j + 1) for i, flags in enumerate(wrong) for j, w in enumerate(flags) if w]
    paths = [out_dir / RECONSTRUCTIONS_PNG]
    plot_image_grid(rows, row_names, column_names, paths[0], marked=marks,
                title="Inputs and reconstructions from the predicted class capsule"
                      + (" (red: misclassified)" if marks else ""))
    for grid in grids:
        path = out_dir / perturbation_filename(grid.class_index, class_names[grid.class_index])
        dims = [f"dim {d}" for d in range(grid.images.shape[0])]
        images, how = perturbation_view(grid)
        plot_image_grid([list(row) for row in images], dims,
                        [f"{s:+.2f}" for s in grid.shifts], path,
                        title=f"'{class_names[grid.class_index]}' sample "
                              f"{grid.sample_index}: each dimension of the "
                              f"'{class_names[grid.predicted]}' capsule shifted\n{how}")
        paths.append(path)
    log.info("capsule grids: %s", ", ".join(p.name for p in paths))
    return paths
