"""A study's claims, curves and routing on its page (issue 25): a toy study whose claims
are known to hold and to fail gets both verdicts in study.json and study.md; a bad
claim is refused in one line when the file is read; the dry run lists the claims; a
table marked as a curve is drawn. No training: the runs are stand-ins."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.pipeline import execute
from capsmed.pipeline.identity import run_identity
from capsmed.pipeline.spec import load_pipeline
from capsmed.pipeline.state import PipelineState
from capsmed.pipeline.study import write_study_report
from tests.pipeline_stand_ins import evaluated_run

SMOKE = Path(__file__).resolve().parents[1] / "pipelines" / "smoke.yaml"
runner = CliRunner()

CLAIMS = [
    {"name": "capsnet-ahead", "quote": "CapsNet performs better than LeNet.",
     "source": "toy paper s1", "metric": "macro_f1", "better": {"arch": "capsnet"},
     "than": {"arch": "lenet"}},
    {"name": "lenet-ahead", "quote": "LeNet performs better than CapsNet.",
     "source": "toy paper s2", "metric": "macro_f1", "better": {"arch": "lenet"},
     "than": {"arch": "capsnet"}, "where": {"condition": ["full", "half"]}},
]
ROUTING = {"runs": [{"run_dir": "x", "arch": "capsnet", "layer": "classes",
                     "lower_capsules": 64, "upper_capsules": 2, "by_iterations": [
                         {"iterations": n, "trained": n == 3, "accuracy": 0.75,
                          "entropy": 0.6931, "normalised": 1.0, "agreement": 1.0}
                         for n in (1, 2, 3, 5)]}]}


def _path(tmp_path: Path, change=None) -> Path:
    raw = copy.deepcopy(yaml.safe_load(SMOKE.read_text()))
    raw["variables"]["out"] = str(tmp_path / "out")
    raw["grid"][0]["seed"] = [0, 1, 2]  # 6 pairs: enough to decide at 0.05
    raw["claims"] = copy.deepcopy(CLAIMS)
    if change:
        change(raw)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _toy_study(tmp_path: Path, change=None):
    """The smoke study, its runs evaluated: capsnet 0.05 ahead of lenet, every seed."""
    pipeline = load_pipeline(_path(tmp_path, change))
    state = PipelineState(pipeline.out)
    data = pipeline.stages["tupac16"].output
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_bytes(b"version 1")
    for run in pipeline.runs:
        f = run.fields
        score = 0.80 + 0.01 * f["seed"] + (0.05 if f["arch"] == "capsnet" else 0.0) \
            + (0.002 * f["seed"] if f["condition"] == "half" else 0.0)
        files = {"analysis/routing/routing.json": ROUTING} if f["arch"] == "capsnet" else {}
        evaluated_run(state.run_dir(run, run_identity(run)), f["arch"], f["seed"], score,
                      files)
    return pipeline, state


def test_claims_known_to_hold_and_to_fail_get_both_verdicts(tmp_path):
    pipeline, state = _toy_study(tmp_path)
    path = write_study_report(pipeline, state, pipeline.runs)
    study = json.loads((path.parent / "study.json").read_text())
    verdicts = {c["name"]: c for c in study["claims"]}
    assert verdicts["capsnet-ahead"]["verdict"] == "holds"
    assert verdicts["lenet-ahead"]["verdict"] == "fails"
    assert verdicts["capsnet-ahead"]["effect"] == pytest.approx(0.05)
    assert verdicts["capsnet-ahead"]["pairs"] == 6
    assert verdicts["capsnet-ahead"]["p_adjusted"] < 0.05
    text = path.read_text()
    assert "## Claims" in text and "> CapsNet performs better than LeNet." in text
    assert "| capsnet-ahead | holds |" in text and "| lenet-ahead | fails |" in text
    assert "1 of 2 claims hold, 1 fail, 0 undecided" in text
    page = (path.parent / "study.html").read_text()
    assert "<h2>Claims</h2>" in page and "LeNet performs better than CapsNet." in page


def test_a_table_marked_as_a_curve_is_drawn_beside_the_paper(tmp_path):
    def change(raw):
        table = raw["report"]["tables"][0]
        table["curve"] = {"x": "fraction"}
        table["paper"] = {"half": {"capsnet": 0.9, "lenet": 0.8}, "full": {}}
    pipeline, state = _toy_study(tmp_path, change)
    path = write_study_report(pipeline, state, pipeline.runs)
    study = json.loads((path.parent / "study.json").read_text())
    assert study["tables"][0]["curve"] == "curve_1.png"
    assert (path.parent / "curve_1.png").stat().st_size > 10_000
    assert "(curve_1.png)" in path.read_text()
    page = (path.parent / "study.html").read_text()
    assert page.count("data:image/png;base64,") >= 1 and "hollow markers" in page


def test_reference_numbers_on_other_data_are_shown_but_never_judged(tmp_path):
    """``verdicts: false`` (digits-lowdata beside paper 000's MNIST numbers): the paper
    number stays in the cell and on the curve, with no verdict and no summary line."""
    def change(raw, judge):
        table = raw["report"]["tables"][0]
        table["paper"] = {"half": {"capsnet": 0.9, "lenet": 0.8}}
        if not judge:
            table["verdicts"] = False
    for judge in (True, False):
        (tmp_path / str(judge)).mkdir()
        pipeline, state = _toy_study(tmp_path / str(judge),
                                     lambda raw, judge=judge: change(raw, judge))
        path = write_study_report(pipeline, state, pipeline.runs)
        table = json.loads((path.parent / "study.json").read_text())["tables"][0]
        cell = table["cells"]["half|capsnet"]
        assert cell["paper"] == 0.9
        assert ("verdict" in cell) == judge and ("verdicts" in table) == judge
        assert ("[paper 0.9: " in path.read_text()) == judge
        assert "[paper 0.9]" in path.read_text() or judge


def test_the_page_shows_the_routing_of_the_analysed_capsule_runs(tmp_path, monkeypatch):
    pipeline, state = _toy_study(tmp_path)
    monkeypatch.setattr(execute, "run_logged", lambda argv, log, env=None: 0)
    first = pipeline.analyses[0]  # routing of capsnet, full, seed 0
    argv = execute.analysis_argv(first, pipeline, state)
    execute.execute_analysis(state, first, argv, execute.analysis_inputs(pipeline, argv), {})
    path = write_study_report(pipeline, state, pipeline.runs)
    text = path.read_text()
    # (a mark is escaped in Markdown: it renders as 0.6931*, not as emphasis)
    assert "Routing: mean coupling entropy" in text and "0.6931\\*" in text
    assert "Routing: test accuracy with 1 and with 3 routing iterations" in text
    routing = json.loads((path.parent / "study.json").read_text())["routing"]
    assert [r["run"] for r in routing] == ["tupac16-capsnet-full-seed0"]  # analysed only


@pytest.mark.parametrize("claim, message", [
    ({"better": {"archh": "capsnet"}, "than": {"archh": "lenet"}},
     "claims[0] (capsnet-ahead): better/than: unknown grid field 'archh'"),
    ({"than": {"arch": "resnet"}}, "claims[0] (capsnet-ahead): better/than: arch has no "
                                   "value resnet on the grid"),
    ({"where": {"condition": "quarter"}}, "condition has no value quarter"),
    ({"metric": "f1"}, "unknown metric 'f1'"),
    ({"evaluation": "held-out"}, "evaluation 'held-out' is not an evaluation of its runs"),
    ({"scopee": "every"}, "claims[0]: unknown key(s) scopee"),
])
def test_a_bad_claim_is_refused_in_one_line(tmp_path, claim, message):
    path = _path(tmp_path, lambda raw: raw["claims"][0].update(claim))
    result = runner.invoke(app, ["run", "--dry-run", str(path)])
    assert result.exit_code == 1 and message in result.stderr, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: claims[0]")


def test_the_dry_run_lists_the_claims(tmp_path):
    result = runner.invoke(app, ["run", "--dry-run", str(_path(tmp_path))])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "2 claim(s) to test" in out
    assert "capsnet-ahead (toy paper s1): macro_f1 of arch capsnet > lenet" in out
    listed = out[out.index("2 claim(s) to test"):].splitlines()
    assert len(listed) == 5 and all(len(line) <= 80 for line in listed)


def test_names_and_quotes_reach_study_md_as_written(tmp_path):
    """A claim named ``<b>`` was an HTML tag GitHub hid, ``*x*`` came out italic."""
    def change(raw):
        raw["name"] = "toy *study*"
        raw["claims"][0].update(name="<b>-ahead", quote="CapsNet is *better* than <i>LeNet")
    pipeline, state = _toy_study(tmp_path, change)
    text = write_study_report(pipeline, state, pipeline.runs).read_text()
    assert text.startswith("# toy \\*study\\*\n")
    assert "**&lt;b>-ahead (toy paper s1)**" in text
    assert "> CapsNet is \\*better\\* than &lt;i>LeNet" in text
    assert "<b>" not in text and "<i>" not in text


def test_claims_and_tables_pool_only_runs_as_the_pipeline_now_makes_them(tmp_path):
    """A report of an earlier version of the file (evaluate split test, now val), a run
    interrupted while training again and one whose weights are damaged were all pooled
    into the tables and claims (``capsmed run --only`` leaves the others as they are)."""
    pipeline, state = _toy_study(
        tmp_path, lambda raw: raw.update(evaluate=[{"name": "report", "split": "val"}]))
    for run in pipeline.runs:
        run_dir = state.run_dir(run, run_identity(run))
        if run.fields["seed"] < 2:  # evaluated again on val; seed 2 still on test
            report = json.loads((run_dir / "report" / "report.json").read_text())
            (run_dir / "report" / "report.json").write_text(json.dumps(
                {**report, "split": "val"}))
        if run.fields["seed"] == 1 and run.fields["condition"] == "full":
            if run.fields["arch"] == "capsnet":
                (run_dir / "resume.pt").write_bytes(b"state")  # training again
            else:
                (run_dir / "checkpoint.safetensors").write_bytes(b"other weights")
    path = write_study_report(pipeline, state, pipeline.runs)
    study = json.loads((path.parent / "study.json").read_text())
    assert study["tables"][0]["runs"] == 6  # seed 0 (4), seed 1 half (2)
    pairs = {c["name"]: c["pairs"] for c in study["claims"]}
    assert pairs == {"capsnet-ahead": 3, "lenet-ahead": 3}


def test_a_holm_p_value_is_never_rounded_across_alpha_beside_its_verdict():
    """A Holm-corrected 0.0496 showed 0.050 beside "holds" (p < 0.05)."""
    from capsmed.pipeline.study_claims import _number

    assert _number(0.0496) == "0.0496"
    assert _number(0.05004) == "0.050"  # not below alpha, and 0.050 is not either
    assert _number(0.0512) == "0.051" and _number(0.0004) == "< 0.001"
