"""Per-cell verdicts on the paper's numbers (issue 25): our mean's 95 % t-interval over
the repetitions against the paper's printed number (± half its last digit)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from capsmed.evaluate.aggregate import EvaluatedRun
from capsmed.evaluate.verdicts import printed_half_unit, summary, t_interval, verdict


def test_the_interval_is_the_t_interval_of_the_mean():
    values = [0.90, 0.91, 0.93, 0.92]
    low, high = t_interval(values)
    expected = stats.t.interval(0.95, 3, loc=np.mean(values), scale=stats.sem(values))
    assert (low, high) == pytest.approx(expected)
    assert t_interval([0.9]) is None


@pytest.mark.parametrize(("paper", "half"), [(0.909, 0.0005), (66, 0.5), (99.22, 0.005),
                                             (100, 0.5), (0.5, 0.05)])
def test_a_printed_number_stands_for_half_a_unit_of_its_last_digit(paper, half):
    assert printed_half_unit(paper) == pytest.approx(half)


def test_verdicts():
    seeds = [0.90, 0.91, 0.93, 0.92]  # interval about 0.894 .. 0.936
    assert verdict(seeds, 0.915).word == "reproduced"
    assert verdict(seeds, 0.95).word == "below" and verdict(seeds, 0.85).word == "above"
    assert verdict(seeds, 0.937).word == "below"  # 0.9365 .. 0.9375, above 0.9355
    assert verdict(seeds, 0.94).word == "reproduced"  # printed 0.94: 0.935 .. 0.945
    assert verdict([0.9], 0.9).word == "undecided"  # one run: no interval
    # the paper's rounding counts: 0.94 printed stands for 0.935 .. 0.945
    assert verdict([0.93, 0.93, 0.93], 0.94).word == "below"
    assert verdict([0.935, 0.935, 0.935], 0.94).word == "reproduced"
    # a table in percent: our fractions scaled, the paper's number as printed
    judged = verdict([0.9922, 0.9925, 0.9921], 99.23, scale=100)
    assert judged.word == "reproduced" and 99.1 < judged.low < 99.23 < judged.high
    line = summary([verdict(seeds, 0.915), verdict(seeds, 0.95), verdict([0.9], 0.9)])
    assert line.startswith("1 of 3 cells with a paper number reproduced (1 below, "
                           "1 undecided)")


def test_a_paper_number_printed_with_a_zero_decimal_keeps_its_digit():
    # paper 001's WAcc "76.0" is a float in YAML; normalising it to 76 judged it against
    # 75.5 .. 76.5 (ten times too wide), so 75.6 +- 0.1 was "reproduced"
    assert printed_half_unit(76.0) == pytest.approx(0.05)
    assert printed_half_unit(76) == pytest.approx(0.5)  # printed without a decimal
    ours = [0.755, 0.756, 0.757, 0.756]  # 75.47 .. 75.73 %
    assert verdict(ours, 76.0, scale=100).word == "below"
    assert verdict(ours, 76, scale=100).word == "reproduced"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_nan_or_infinite_repetition_is_undecided_not_reproduced(bad):
    # a NaN interval compares false both ways: it used to fall through to "reproduced"
    assert verdict([0.2, bad, 0.3], 0.9).word == "undecided"
    assert verdict([0.2, bad], 90, scale=100).word == "undecided"


def test_a_nan_read_from_an_analysis_file_is_not_judged_reproduced():
    from capsmed.pipeline.study import metric_table

    runs = [(SimpleNamespace(fields={"condition": "f1", "arch": "capsnet"}), v)
            for v in (0.2, float("nan"), 0.3)]  # json.loads reads NaN
    spec = {"rows": "condition", "columns": "arch", "paper": {"f1": {"capsnet": 0.9}}}
    _, numbers = metric_table(spec, runs)
    assert numbers["verdicts"]["reproduced"] == 0
    assert numbers["cells"]["f1|capsnet"]["verdict"] == "undecided"


def test_the_study_table_gives_each_paper_number_its_verdict():
    from capsmed.pipeline.study import metric_table

    runs = [(SimpleNamespace(fields={"condition": c, "arch": a}), v)
            for c, a, values in (("f1", "capsnet", [0.94, 0.95, 0.945, 0.94]),
                                 ("f1", "lenet", [0.80, 0.82, 0.81, 0.80]),
                                 ("f5", "capsnet", [0.97]))
            for v in values]
    spec = {"title": "T2a", "rows": "condition", "columns": "arch",
            "paper": {"f1": {"capsnet": 0.943, "lenet": 0.909}, "f5": {"capsnet": 0.975}}}
    table, numbers = metric_table(spec, runs)
    assert table.rows[0] == ["f1", "0.944 ± 0.005 (n=4) [paper 0.943: reproduced]",
                             "0.808 ± 0.010 (n=4) [paper 0.909: below]"]
    assert table.rows[1] == ["f5", "0.970 [paper 0.975: undecided]", "-"]
    assert table.notes[0].startswith("1 of 3 cells with a paper number reproduced "
                                     "(1 below, 1 undecided)")
    assert numbers["verdicts"] == {"reproduced": 1, "above": 0, "below": 1, "undecided": 1}
    cell = numbers["cells"]["f1|lenet"]
    assert cell["verdict"] == "below" and cell["interval"][1] < 0.909 - 0.0005


def test_the_study_page_links_each_evaluated_runs_report(tmp_path):
    from pathlib import Path

    from capsmed.evaluate.aggregate import EvaluatedRun
    from capsmed.pipeline.study import StudyParts, study_page
    from capsmed.tables import Column, Table, text_column

    out = tmp_path / "out" / "report"
    runs = [EvaluatedRun(path=tmp_path / "out" / "runs" / name, dataset="d", arch="a",
                         protocol="full", settings={}, seed=0, fold=None,
                         class_names=("x", "y"), metrics={}, per_class={},
                         confusion=np.eye(2, dtype=int))
            for name in ("b-seed1", "a-seed0")]
    table = Table("T2a", [text_column("condition"), Column("capsnet")],
                  [["f1", "0.944 [paper 0.943: reproduced]"]], notes=["1 of 1 ..."])
    pipeline = SimpleNamespace(name="study <1>", description="what it checks",
                               path=Path("pipelines/x.yaml"))
    page = study_page(pipeline, StudyParts([table], [], [], [], []), runs, out,
                      "Cells: ...")
    assert "<title>study &lt;1&gt;</title>" in page and "pipelines/x.yaml" in page
    assert page.index('href="../runs/a-seed0/report/report.html"') < page.index(
        'href="../runs/b-seed1/report/report.html"')
    assert "0.944 [paper 0.943: reproduced]" in page and "<li>1 of 1 ...</li>" in page


def test_a_per_class_paper_number_no_row_shows_is_said_not_dropped():
    # a misspelt class or a "recall:" key was never shown, and nothing said so
    from capsmed.pipeline.study import per_class_table

    run = EvaluatedRun(path=Path("r"), dataset="d", arch="a", protocol="full", settings={},
                       seed=0, fold=None, class_names=("NGS", "LYT"), metrics={},
                       per_class={}, confusion=np.array([[8, 2], [1, 9]]))
    spec = {"paper": {"NGS": {"precision": 0.9, "recall": 0.8}, "LTY": {"precision": 0.7},
                      "LYT": 0.5}}
    table, _ = per_class_table(spec, [(SimpleNamespace(fields={}), run)])
    assert table.rows[0][1] == "0.889 [paper 0.9]"
    assert any("LTY not shown: not a class of these runs (NGS, LYT)" in n
               for n in table.notes)
    assert any("recall, LYT (a bare number) not shown" in n for n in table.notes)
    clean, _ = per_class_table({"paper": {"NGS": {"precision": 0.9}}},
                               [(SimpleNamespace(fields={}), run)])
    assert not any("not shown" in n for n in clean.notes)
