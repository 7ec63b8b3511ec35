"""matplotlib for files only (no display), and PNGs written atomically.

One place for every figure capsmed draws (training curves, confusion matrices, the
analyses' plots), so they share a backend, a resolution and the atomic write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capsmed.io import atomic_path

DPI = 120


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plain(text: str) -> str:
    """``text`` for a figure, drawn as written: matplotlib reads what lies between two
    ``$`` as mathtext (a class named ``$5 ml$`` lost its dollars and came out italic);
    an escaped ``\\$`` is drawn as ``$``. Every user-given name passes through here."""
    return str(text).replace("$", r"\$")


def whole_epochs(fig: Any) -> None:
    """Every axis labelled ``epoch`` ticks whole epochs only: matplotlib put 1.25, 1.5 ...
    between the two epochs of a short run, epochs no run has."""
    from matplotlib.ticker import MaxNLocator

    for ax in fig.axes:
        if ax.get_xlabel().strip().lower() == "epoch":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def save_figure(fig: Any, path: Path, tight: bool = True) -> None:
    """Save ``fig`` as a PNG atomically, then close it (epoch axes in whole epochs, see
    :func:`whole_epochs`)."""
    whole_epochs(fig)
    with atomic_path(Path(path), suffix=".png") as tmp:
        fig.savefig(tmp, dpi=DPI, format="png", **({"bbox_inches": "tight"} if tight else {}))
    pyplot().close(fig)
