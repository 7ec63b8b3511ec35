"""Figures people would rather look at than read: confusion matrices, training curves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from capsmed.io import atomic_path  # noqa: E402


def _save(fig: plt.Figure, path: Path) -> None:
    with atomic_path(Path(path), suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(fig)


def plot_confusion_matrix(cm: np.ndarray, class_names: Sequence[str], path: Path,
                          title: str = "") -> None:
    """Counts and row-normalised (sensitivity on the diagonal) side by side."""
    rows = cm.sum(axis=1, keepdims=True)
    norm = np.divide(cm, rows, out=np.zeros_like(cm, dtype=float), where=rows > 0)
    k = len(class_names)
    size = max(3.5, 0.55 * k + 2)
    fig, axes = plt.subplots(1, 2, figsize=(2 * size + 1.5, size), layout="constrained")
    for ax, data, name, fmt in ((axes[0], cm, "counts", "d"),
                                (axes[1], norm, "row-normalised", ".2f")):
        im = ax.imshow(data, cmap="Blues", vmin=0)
        ax.set_xticks(range(k), class_names, rotation=45, ha="right")
        ax.set_xlabel("predicted")
        if ax is axes[0]:  # the right panel shares the rows; repeating labels collides
            ax.set_yticks(range(k), class_names)
            ax.set_ylabel("true")
        else:
            ax.set_yticks(range(k), [""] * k)
        ax.set_title(f"{title} ({name})" if title else name)
        peak = data.max() if data.size else 0
        for i in range(k):
            for j in range(k):
                ax.text(j, i, format(data[i, j], fmt), ha="center", va="center",
                        color="white" if peak and data[i, j] > 0.5 * peak else "black")
        fig.colorbar(im, ax=ax, shrink=0.8)
    _save(fig, path)


def plot_training_curves(records: list[dict], path: Path) -> None:
    """Loss and accuracy per epoch, train vs validation, best epoch marked."""
    if not records:
        return
    epochs = [r["epoch"] for r in records]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, ax in (("loss", ax_loss), ("acc", ax_acc)):
        ax.plot(epochs, [r[f"train_{key}"] for r in records], marker="o", label="train")
        if "val_loss" in records[0]:
            ax.plot(epochs, [r[f"val_{key}"] for r in records], marker="o", label="val")
        ax.set_xlabel("epoch")
        ax.set_ylabel("loss" if key == "loss" else "accuracy")
        ax.grid(alpha=0.3)
    best = [r["epoch"] for r in records if r.get("best")]
    if best:
        ax_loss.axvline(best[-1], color="grey", linestyle="--", label="kept checkpoint")
    ax_loss.legend()
    _save(fig, path)
