"""The training curves every run directory gets (``curves.png``)."""

from __future__ import annotations

from pathlib import Path

from capsmed.figures import pyplot, save_figure


def plot_training_curves(records: list[dict], path: Path) -> None:
    """Loss and accuracy per epoch, train vs validation, best epoch marked."""
    if not records:
        return
    plt = pyplot()
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
    save_figure(fig, path)
