"""Figures people would rather look at than read: confusion matrices, image mosaics.

(Training curves are drawn by the trainer: :mod:`capsmed.train.curves`.)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from capsmed.figures import plain, pyplot, save_figure

plt = pyplot()
_save = save_figure


def row_normalised(cm: np.ndarray) -> np.ma.MaskedArray:
    """Each row over its total (sensitivity on the diagonal); a class without samples
    has no rates: its row is masked, drawn ``n/a`` as in the tables, not 0.00."""
    rows = cm.sum(axis=1, keepdims=True)
    norm = np.divide(cm, rows, out=np.zeros_like(cm, dtype=float), where=rows > 0)
    return np.ma.masked_array(norm, mask=np.broadcast_to(rows == 0, cm.shape))


def plot_confusion_matrix(cm: np.ndarray, class_names: Sequence[str], path: Path,
                          title: str = "") -> None:
    """Counts and row-normalised (sensitivity on the diagonal) side by side."""
    norm = row_normalised(cm)
    class_names, title = [plain(n) for n in class_names], plain(title)
    k = len(class_names)
    size = max(3.5, 0.55 * k + 2)
    fig, axes = plt.subplots(1, 2, figsize=(2 * size + 1.5, size), layout="constrained")
    cmap = plt.get_cmap("Blues").with_extremes(bad="#e0e0e0")  # no samples: grey
    for ax, data, name, fmt in ((axes[0], np.ma.masked_array(cm), "counts", "d"),
                                (axes[1], norm, "row-normalised", ".2f")):
        im = ax.imshow(data, cmap=cmap, vmin=0)
        ax.set_xticks(range(k), class_names, rotation=45, ha="right")
        ax.set_xlabel("predicted")
        if ax is axes[0]:  # the right panel shares the rows; repeating labels collides
            ax.set_yticks(range(k), class_names)
            ax.set_ylabel("true")
        else:
            ax.set_yticks(range(k), [""] * k)
        ax.set_title(f"{title} ({name})" if title else name)
        peak = data.max() if data.count() else 0
        for i in range(k):
            for j in range(k):
                value = data[i, j]
                ax.text(j, i, "n/a" if value is np.ma.masked else format(value, fmt),
                        ha="center", va="center", color="white" if peak and value
                        is not np.ma.masked and value > 0.5 * peak else "black")
        fig.colorbar(im, ax=ax, shrink=0.8)
    _save(fig, path)


def _displayable(image: np.ndarray) -> np.ndarray:
    """[C, H, W] in [0, 1] -> [H, W] (grey) or [H, W, 3] (RGB); other counts: channel 0."""
    image = np.clip(np.asarray(image, dtype=np.float32), 0.0, 1.0)
    return image.transpose(1, 2, 0) if image.shape[0] == 3 else image[0]


def image_mosaic(rows: Sequence[Sequence[np.ndarray]], pad: int = 2) -> np.ndarray:
    """Tile images [C, H, W] (rows may be ragged) into one array with white gutters."""
    tiles = [[_displayable(im) for im in row] for row in rows]
    h, w = tiles[0][0].shape[:2]
    extra = tiles[0][0].shape[2:]
    cols = max(len(row) for row in tiles)
    mosaic = np.ones((len(tiles) * (h + pad) - pad, cols * (w + pad) - pad, *extra),
                     dtype=np.float32)
    for i, row in enumerate(tiles):
        for j, tile in enumerate(row):
            mosaic[i * (h + pad):i * (h + pad) + h, j * (w + pad):j * (w + pad) + w] = tile
    return mosaic


def plot_image_grid(rows: Sequence[Sequence[np.ndarray]], row_names: Sequence[str],
                    column_names: Sequence[str], path: Path, title: str = "",
                    marked: Sequence[tuple[int, int]] = (), pad: int = 2) -> None:
    """Draw a grid of images [C, H, W] in [0, 1] as one picture with named rows/columns.

    One ``imshow`` of a mosaic rather than an axes per tile: a 16x11 perturbation grid
    would otherwise take seconds to lay out. ``marked`` tiles get a red frame.
    """
    mosaic = image_mosaic(rows, pad)
    row_names, column_names = [plain(n) for n in row_names], [plain(n) for n in column_names]
    h, w = np.asarray(rows[0][0]).shape[1:]
    cols = max(len(row) for row in rows)
    tile = 0.55  # inches per tile: small images stay legible without huge files
    fig, ax = plt.subplots(figsize=(max(4.0, cols * tile + 1.6),
                                    max(2.5, len(rows) * tile + 1.0)), layout="constrained")
    ax.imshow(mosaic, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_xticks([j * (w + pad) + (w - 1) / 2 for j in range(len(column_names))],
                  column_names, rotation=90 if cols > 8 else 0, fontsize=8)
    ax.set_yticks([i * (h + pad) + (h - 1) / 2 for i in range(len(row_names))],
                  row_names, fontsize=8)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    for i, j in marked:
        ax.add_patch(plt.Rectangle((j * (w + pad) - 0.5, i * (h + pad) - 0.5), w, h,
                                   fill=False, edgecolor="red", linewidth=1.5))
    if title:
        ax.set_title(plain(title), fontsize=9)
    _save(fig, path)
