"""A study table as curves: our means per condition and the paper's numbers beside."""

from __future__ import annotations

import matplotlib.image

from capsmed.evaluate.curve_plot import plot_curves

X = {"f1": 1, "f5": 5, "f10": 10, "full": 100}


def test_curves_draw_ours_and_the_papers_points(tmp_path):
    ours = {"lenet": {"f5": [0.80, 0.82], "f10": [0.90, 0.88], "full": [0.97]},
            "capsnet": {"f5": [0.87], "f10": [], "unknown-row": [0.5]}}
    paper = {"f1": {"lenet": 0.909, "capsnet": 0.943}, "f5": {"lenet": 0.961},
             "full": {}}
    drawn = plot_curves(tmp_path / "c.png", "F1 vs data", X, ours, paper)
    # lenet: 3 rows; capsnet: f5 only (f10 has no run, unknown-row has no x)
    assert drawn == {"ours": 4, "paper": 3}
    image = matplotlib.image.imread(tmp_path / "c.png")
    assert image.shape[0] > 300 and image.shape[1] > 500
    assert not list(tmp_path.glob(".*"))  # written atomically, nothing left beside
