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


def test_a_study_curve_in_percent_says_so_on_its_axis(tmp_path, monkeypatch):
    """``scale: 100`` drew 60-80 on an axis labelled ``balanced accuracy``, a fraction."""
    from types import SimpleNamespace

    from capsmed.evaluate import curve_plot
    from capsmed.pipeline.study_curves import draw_table_curves

    labels = []
    monkeypatch.setattr(curve_plot, "plot_curves",
                        lambda *a, **kw: labels.append(kw["ylabel"]) or {})
    found = [(SimpleNamespace(fields={"condition": c, "arch": "capsnet"},
                              train={"fraction": f}), v)
             for c, f, v in (("half", 0.5, 0.7), ("full", None, 0.8))]
    spec = {"rows": "condition", "columns": "arch", "metric": "balanced_accuracy",
            "curve": {"x": "fraction"}}
    for scale in (1, 100):
        draw_table_curves({**spec, "scale": scale}, found, tmp_path / "c.png")
    assert labels == ["balanced accuracy", "balanced accuracy (%)"]
