"""What a figure writes is what the user named: class names, run and dataset names reach
matplotlib as plain text, never as mathtext (``$5 ml$`` lost its dollars, italic)."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from capsmed.evaluate.aggregate import Stat
from capsmed.evaluate.analyses import routing
from capsmed.evaluate.curve_plot import plot_curves
from capsmed.evaluate.fraction_plot import FractionFamily, plot_fraction_family
from capsmed.evaluate.plots import plot_confusion_matrix, plot_image_grid
from capsmed.predict.outputs import InputResult, write_heatmap

NAMES = ["$5 ml$", "$10 ml$"]


@pytest.fixture
def drawn(monkeypatch):
    """``(text shown, drawn as mathtext)`` of every text of every figure saved."""
    figures: list[Figure] = []
    save = Figure.savefig

    def keep(fig, *args, **kw):
        figures.append(fig)
        return save(fig, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", keep)
    return lambda: [t._preprocess_math(t.get_text()) for fig in figures
                    for t in fig.findobj(Text) if t.get_text()]


def _shown_as_written(texts, *wanted):
    for text in wanted:
        assert (text, False) in texts, (text, [t for t in texts if "$" in t[0]])
    assert not [t for t in texts if t[1]]  # nothing is drawn as mathtext


def test_class_names_with_dollars_are_drawn_as_written(drawn, tmp_path):
    plot_confusion_matrix(np.array([[3, 1], [0, 4]]), NAMES, tmp_path / "cm.png",
                          title="run $a$")
    plot_image_grid([[np.zeros((1, 4, 4))] * 2] * 2, NAMES, ["$in$", "recon"],
                    tmp_path / "grid.png", title="'$5 ml$' sample 3")
    _shown_as_written(drawn(), *NAMES, "run $a$ (counts)", "$in$", "'$5 ml$' sample 3")


def test_curve_and_fraction_labels_with_dollars_are_drawn_as_written(drawn, tmp_path):
    plot_curves(tmp_path / "c.png", "F1 $vs$ data", {"f5": 5, "full": 100},
                {"$net$": {"f5": [0.8], "full": [0.9]}}, log_x=False)
    points = [(0.1, Stat(0.7, 0.01, 2)), (1.0, Stat(0.9, 0.01, 2))]
    plot_fraction_family(FractionFamily("$lr$=0.1", {"$set$": {"$arch$": points}}),
                         "macro_f1", "macro F1", tmp_path / "f.png")
    _shown_as_written(drawn(), "F1 $vs$ data", "$net$ (ours)", "$set$", "$arch$",
                      "$lr$=0.1")


def test_run_class_and_input_names_in_analyses_and_heatmaps_are_drawn_as_written(
        drawn, tmp_path):
    curve = [{"epoch": e, "routing_entropy": 0.5, "normalised": 0.7, "val_acc": 0.8}
             for e in (1, 2)]
    results = [routing.RoutingResult(str(tmp_path / name), "capsnet", "classes", 8, 2, curve,
                                     0.5, 0.7, {c: {"normalised": 0.7} for c in NAMES}, 4)
               for name in ("run $a$", "run $b$")]
    labels = routing._labels(results)
    routing._plot_epochs(results, labels, tmp_path)
    routing._plot_test(results, labels, tmp_path)
    write_heatmap(tmp_path / "h.png", InputResult("in/$x$.png", (8, 8), np.array([4]),
                                                  np.array([4]), 8.0, np.array([[0.2, 0.8]])),
                  NAMES, 1)
    _shown_as_written(drawn(), *NAMES, "run $a$", "run $b$", "$x$.png: $10 ml$",
                      "score: $10 ml$")
