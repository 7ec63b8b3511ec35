"""``capsmed report``: aggregation, paired tests, paper layouts, plots, CLI.

One real run is trained and evaluated at tiny size, so report.json and config.yaml have
the schema the real code writes; the other runs are copies of it whose numbers come
from hand-picked confusion matrices pushed through the real metrics code.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace

import numpy as np
import pytest
import yaml
from scipy import stats
from sklearn.metrics import f1_score
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.errors import CapsmedError
from capsmed.evaluate.aggregate import collect_runs, group_runs, group_warnings
from capsmed.evaluate.aggregate_report import ReportConfig, report_runs
from capsmed.evaluate.metrics import classification_report
from capsmed.evaluate.per_class import mean_per_class, pooled_per_class
from capsmed.evaluate.significance import paired_p_value
from capsmed.tables.text import latex, latex_escape
from capsmed.train.protocol import protocol_label, protocol_settings
from tests.helpers import assert_clean_failure

runner = CliRunner()

# (arch, seed) -> confusion matrix [true, predicted] on the 20 test images
FULL = {("lenet", 1): [[8, 2], [1, 9]], ("lenet", 2): [[7, 3], [2, 8]],
        ("lenet", 3): [[9, 1], [0, 10]], ("capsnet", 1): [[9, 1], [1, 9]],
        ("capsnet", 2): [[9, 1], [0, 10]], ("capsnet", 3): [[10, 0], [1, 9]],
        ("capsnet", 4): [[5, 5], [5, 5]]}  # seed 4 has no lenet partner
TENTH = {("lenet", 1): [[6, 4], [3, 7]], ("lenet", 2): [[7, 3], [3, 7]],
         ("capsnet", 1): [[8, 2], [2, 8]]}  # one matched pair only
FOLDS = {0: [[5, 1], [2, 2]], 1: [[3, 0], [5, 6]]}  # paper 001 style CV, 2 folds


def _labels(cm):
    cm = np.asarray(cm)
    y_true = np.repeat(np.arange(len(cm)), cm.sum(axis=1))
    y_pred = np.concatenate([np.repeat(np.arange(len(cm)), row) for row in cm])
    return y_true, y_pred


@pytest.fixture(scope="module")
def real_run(tiny_h5, tmp_path_factory):
    """A real lenet run trained for one epoch and evaluated: the schema's source."""
    from capsmed.evaluate.evaluation import evaluate_run
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train

    out = tmp_path_factory.mktemp("real") / "run"
    train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16, seed=0,
                      device="cpu", out=str(out)), disable_progress=True)
    evaluate_run(out, device="cpu")
    return out


def make_run(template, dest, arch, seed, cm, **train_changes):
    """Copy ``template``; set arch/seed/protocol in config.yaml, ``cm``'s numbers in the report."""
    shutil.copytree(template, dest)
    config = yaml.safe_load((dest / "config.yaml").read_text())
    config["train"].update(arch=arch, seed=seed, out=str(dest), **train_changes)
    (dest / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    original = json.loads((dest / "report" / "report.json").read_text())
    y_true, y_pred = _labels(cm)
    report = classification_report(y_true, y_pred, original["class_names"]).to_dict()
    context = {k: v for k, v in original.items() if k not in report}
    new = {**context, **report, "arch": arch, "run_dir": str(dest), "samples": len(y_true)}
    assert set(new) == set(original)  # exactly the schema capsmed evaluate writes
    (dest / "report" / "report.json").write_text(json.dumps(new, indent=2))
    return dest


@pytest.fixture(scope="module")
def runs_root(real_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for (arch, seed), cm in FULL.items():
        make_run(real_run, root / "full" / f"{arch}-s{seed}", arch, seed, cm)
    for (arch, seed), cm in TENTH.items():
        make_run(real_run, root / "tenth" / arch / f"s{seed}", arch, seed, cm, fraction=0.1)
    for fold, cm in FOLDS.items():
        make_run(real_run, root / "cv" / f"capsnet-f{fold}", "capsnet", 0, cm, fold=fold,
                 folds=2)
    make_run(real_run, root / "aug" / "lenet-s1", "lenet", 1, [[8, 2], [2, 8]],
             augment=True, augment_recipe="paper000-medical")
    pending = make_run(real_run, root / "pending" / "lenet-s9", "lenet", 9, [[1, 0], [0, 1]])
    shutil.rmtree(pending / "report")  # trained, never evaluated
    return root


def _f1(cm):
    return f1_score(*_labels(cm), average="macro")


def _acc(cm):
    return np.trace(cm) / np.sum(cm)


def test_protocol_defaults_for_missing_keys():
    assert protocol_label(protocol_settings({})) == "full"
    old = protocol_settings({"fraction": 1.0, "augment": False, "augment_recipe": "x"})
    assert old == protocol_settings({}) and old["folds"] is None
    s = protocol_settings({"fraction": 0.05, "imbalance": {"mitosis": 20},
                           "augment": True, "augment_recipe": "paper000-medical",
                           "sampler": "balanced", "class_weights": "balanced",
                           "folds": 5, "fold": 3, "per_class_limit": 25})
    assert protocol_label(s) == ("fraction 0.05, mitosis 20%, augment paper000-medical, "
                                 "balanced batches, balanced class weights, per-class "
                                 "limit 25, 5-fold CV")
    assert protocol_label(protocol_settings({"fold": 0})) == "CV"  # folds (k) not recorded
    # --fold 1 and --fold 1 --folds 5 on a 5-fold file: one protocol (config.yaml's
    # dataset.folds), not a "CV" and a "5-fold CV" group each holding some folds
    assert protocol_settings({"fold": 1}, None, 5) == protocol_settings({"fold": 0, "folds": 5})
    assert protocol_label(protocol_settings({"fold": 1}, None, 5)) == "5-fold CV"


def test_means_and_sample_stds(runs_root, caplog):
    with caplog.at_level(logging.WARNING, logger="capsmed"):
        collection = collect_runs([runs_root])
    assert len(collection.runs) == 13
    assert [s.path.name for s in collection.skipped] == ["lenet-s9"]
    assert "capsmed evaluate" in collection.skipped[0].reason
    assert "lenet-s9: skipped" in caplog.text and "capsmed evaluate" in caplog.text
    groups = {(g.dataset, g.protocol, g.arch): g for g in group_runs(collection.runs)}
    assert set(groups) == {("tupac16", p, a) for p, a in [
        ("full", "lenet"), ("full", "capsnet"), ("fraction 0.1", "lenet"),
        ("fraction 0.1", "capsnet"), ("2-fold CV", "capsnet"),
        ("augment paper000-medical", "lenet")]}
    lenet = groups["tupac16", "full", "lenet"]
    cms = [FULL["lenet", s] for s in (1, 2, 3)]
    acc = lenet.stat("accuracy")
    assert (acc.mean, acc.std, acc.n) == pytest.approx((0.85, 0.1, 3))
    f1 = lenet.stat("macro_f1")
    assert f1.mean == pytest.approx(np.mean([_f1(c) for c in cms]))
    assert f1.std == pytest.approx(np.std([_f1(c) for c in cms], ddof=1))
    sens = mean_per_class(lenet.runs)["per_class"]["mitosis"]["sensitivity"]
    assert (sens.mean, sens.std) == pytest.approx((0.9, 0.1))  # 9/10, 8/10, 10/10
    single = groups["tupac16", "augment paper000-medical", "lenet"].stat("accuracy")
    assert single.n == 1 and single.std is None
    # duplicates of a folder and a run inside it count once
    again = collect_runs([runs_root / "full", runs_root / "full" / "lenet-s1"])
    assert len(again.runs) == 7


def test_the_data_revision_evaluate_records_is_not_a_metric(real_run, tmp_path):
    """report.json's data_revision (an int beside the scores) was averaged as a metric:
    a 'data_revision' column of the groups table, accepted by --metric and tested."""
    from capsmed.evaluate.aggregate import load_evaluated_run

    report = json.loads((real_run / "report" / "report.json").read_text())
    assert isinstance(report["data_revision"], int)  # the real evaluate writes it
    assert "data_revision" not in load_evaluated_run(real_run).metrics
    with pytest.raises(CapsmedError, match="--metric data_revision: not in the reports"):
        report_runs([real_run], tmp_path / "rep", ReportConfig(metric="data_revision"))


def test_pooled_precision_sensitivity_hand_example(runs_root):
    cv = next(g for g in group_runs(collect_runs([runs_root / "cv"]).runs))
    assert [r.repetition_label for r in cv.runs] == ["seed 0 fold 0", "seed 0 fold 1"]
    pooled = pooled_per_class(cv.runs)
    # summed confusion matrix [[8, 1], [7, 8]]
    assert pooled["confusion_matrix"] == [[8, 1], [7, 8]]
    non, mit = pooled["per_class"]["non-mitosis"], pooled["per_class"]["mitosis"]
    assert (non["precision"], non["sensitivity"], non["support"]) == pytest.approx(
        (8 / 15, 8 / 9, 9))
    assert (mit["precision"], mit["sensitivity"], mit["support"]) == pytest.approx(
        (8 / 9, 8 / 15, 15))
    assert pooled["total"]["precision"] == pytest.approx((8 / 15 + 8 / 9) / 2)
    assert pooled["total"]["sensitivity"] == pytest.approx((8 / 9 + 8 / 15) / 2)
    mean = mean_per_class(cv.runs)["per_class"]["non-mitosis"]
    assert mean["precision"].mean == pytest.approx((5 / 7 + 3 / 8) / 2)  # not 8/15
    assert mean["sensitivity"].mean == pytest.approx((5 / 6 + 3 / 3) / 2)


def test_a_mean_over_fewer_runs_than_the_group_has_shows_its_n(real_run, tmp_path):
    """A class absent from one fold's test set has no sensitivity (nor AUC) there: the
    mean tables averaged the other folds and said nothing, beside 'n = 2 runs'."""
    root = tmp_path / "runs"
    make_run(real_run, root / "f0", "lenet", 0, [[3, 1], [1, 3]], fold=0, folds=2)
    make_run(real_run, root / "f1", "lenet", 0, [[5, 0], [0, 0]], fold=1, folds=2)
    path = root / "f0" / "report" / "report.json"  # scored: an AUC where both classes are
    path.write_text(json.dumps({**json.loads(path.read_text()), "auc": 0.8}))
    report_runs([root], tmp_path / "rep", ReportConfig())
    mean_md = (tmp_path / "rep" / "per_class_mean.md").read_text()
    mitosis = next(line for line in mean_md.splitlines() if line.startswith("| mitosis"))
    assert mitosis.count("(n=1)") == 2  # 3/4 in fold 0; undefined in fold 1
    non = next(line for line in mean_md.splitlines() if line.startswith("| non-mitosis"))
    assert "(n=" not in non
    csv = (tmp_path / "rep" / "per_class_mean.csv").read_text().splitlines()
    header, row = csv[0].split(","), next(r for r in csv if ",mitosis," in r).split(",")
    assert row[header.index("sensitivity_n")] == "1" and row[header.index("runs")] == "2"
    groups_md = (tmp_path / "rep" / "groups.md").read_text()
    assert "0.800 (n=1)" in groups_md


def test_paired_tests_against_scipy(runs_root, tmp_path, caplog):
    result = report_runs([runs_root], tmp_path / "rep", ReportConfig(metric="accuracy"))
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    tests = {(t["protocol"], t["arch_a"], t["arch_b"]): t
             for t in summary["significance"]["tests"]}
    full = tests["full", "capsnet", "lenet"]
    caps = [_acc(FULL["capsnet", s]) for s in (1, 2, 3)]
    lenet = [_acc(FULL["lenet", s]) for s in (1, 2, 3)]
    assert full["n"] == 3
    assert full["p_value"] == pytest.approx(stats.ttest_rel(caps, lenet).pvalue)
    assert full["mean_difference"] == pytest.approx(np.mean(caps) - np.mean(lenet))
    assert full["significant"] is False  # p = 0.18 with these numbers
    assert any("capsnet seed 4 left out" in n for n in summary["significance"]["notes"])
    tenth = tests["fraction 0.1", "capsnet", "lenet"]
    assert tenth["n"] == 1 and tenth["p_value"] is None and tenth["significant"] is None
    sig_md = (tmp_path / "rep" / "significance_accuracy.md").read_text()
    assert "n/a" in sig_md and "capsnet seed 4 left out" in sig_md
    assert result.runs == 13 and result.groups == 6

    with caplog.at_level(logging.WARNING, logger="capsmed"):
        report_runs([runs_root / "full"], tmp_path / "w",
                    ReportConfig(metric="accuracy", test="wilcoxon"))
    assert "cannot reach p < 0.05" in caplog.text
    w = json.loads((tmp_path / "w" / "summary.json").read_text())["significance"]["tests"][0]
    assert w["p_value"] == pytest.approx(stats.wilcoxon(caps, lenet).pvalue)
    assert "needs n >= 6" in w["note"]


def test_paired_p_value_edge_cases():
    assert paired_p_value([0.9], [0.8])[1] is None
    assert paired_p_value([0.9, 0.8], [0.9, 0.8])[1] is None  # no difference at all
    a, b = [0.91, 0.93, 0.95, 0.90, 0.97, 0.94, 0.92], [0.88, 0.90, 0.93, 0.89, 0.93, 0.9, 0.91]
    exact = stats.wilcoxon([3, 3, 2, 1, 4, 4, 1]).pvalue  # the differences in hundredths
    assert paired_p_value(a, b, "wilcoxon")[1] == pytest.approx(exact)
    assert paired_p_value(a, b, "wilcoxon")[1] < 0.05 and paired_p_value(a, b, "wilcoxon")[2] == ""


def test_equal_differences_are_ranked_as_ties_not_by_rounding_noise():
    # accuracies on 20 images: 0.7 - 0.5 and 0.7 - 0.9 came out as 0.19999999999999996
    # and -0.20000000000000007, ranked apart: p 0.047 (significant) for an exact 0.0625
    a = [0.65, 0.75, 1.0, 0.95, 0.8, 0.9, 0.75, 0.95, 0.8, 0.65]
    b = [0.5, 0.75, 0.9, 0.55, 0.7, 0.8, 0.85, 0.5, 0.65, 0.75]
    in_twentieths = np.round(np.multiply(a, 20)) - np.round(np.multiply(b, 20))
    _, p, _ = paired_p_value(a, b, "wilcoxon")
    assert p == pytest.approx(stats.wilcoxon(in_twentieths).pvalue) and p > 0.05
    _, p, _ = paired_p_value(a, b, "ttest")
    assert p == pytest.approx(stats.ttest_rel(a, b).pvalue)  # real differences: as scipy


def test_scores_equal_but_for_their_last_bit_are_not_a_difference():
    # mean(0.1, 0.5) and mean(0.2, 0.4) are both 0.3 but differ by 5.6e-17: the t-test
    # of that noise gave p = 0.004, "significant"
    a, b = [np.mean([0.1, 0.5])] * 5 + [0.5], [np.mean([0.2, 0.4])] * 5 + [0.5]
    for test in ("ttest", "wilcoxon"):
        statistic, p, note = paired_p_value(a, b, test)
        assert (statistic, p) == (None, None) and "same in every pair" in note


def test_equal_differences_up_to_rounding_are_a_degenerate_t_test():
    # 0.9 - 0.8 and 0.8 - 0.7 differ in the last bit: t came out as 1.8e15, unflagged
    statistic, p, note = paired_p_value([0.9, 0.8], [0.8, 0.7])
    assert statistic is None and "degenerate" in note
    assert paired_p_value([0.9, 0.8], [0.8, 0.75])[0] is not None  # real spread: kept


def test_tables_in_the_papers_layouts(runs_root, tmp_path):
    report_runs([runs_root], tmp_path / "rep", ReportConfig(archs=("lenet", "capsnet")))
    out = tmp_path / "rep"
    md = (out / "table_macro_f1.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| Dataset"))
    # paper 000: growing fraction, then the full set, then the other protocols; archs in
    # the order asked for
    assert header.index("fraction 0.1 / lenet") < header.index("fraction 0.1 / capsnet") \
        < header.index("full / lenet") < header.index("2-fold CV / capsnet")
    lenet_f1 = [_f1(FULL["lenet", s]) for s in (1, 2, 3)]
    expected = f"{np.mean(lenet_f1):.3f} ± {np.std(lenet_f1, ddof=1):.3f} (n=3)"
    assert expected in md  # n differs between cells, so each cell shows it
    tex = (out / "table_macro_f1.tex").read_text()
    for text in ("\\toprule", "\\midrule", "\\bottomrule", "\\multicolumn{2}{c}{full}",
                 "\\cmidrule(lr)", "$\\pm$"):
        assert text in tex
    rows = (out / "table_macro_f1.csv").read_text().splitlines()
    assert rows[0].startswith("dataset,fraction 0.1 / lenet mean,fraction 0.1 / lenet std,")
    pooled = (out / "per_class_pooled.csv").read_text().splitlines()
    assert "tupac16,2-fold CV,capsnet,non-mitosis,9,0.5333333333333333,0.8888888888888888,2,0" \
        in pooled
    pooled_md = (out / "per_class_pooled.md").read_text()
    assert "| **Total** | **24** | **0.711** | **0.711** |" in pooled_md
    assert "| Class | Images | capsnet / Precision | capsnet / Sensitivity |" in pooled_md
    # seeds share one test split: Images is that split (10 per class), not 3 or 4 times it;
    # lenet summed [[24, 6], [3, 27]], capsnet [[33, 7], [7, 33]]
    assert "| non-mitosis | 10 | 0.889 | 0.800 | 0.825 | 0.825 |" in pooled_md
    assert "\\toprule" in (out / "per_class_mean.tex").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "capsmed report"
    assert summary["files"] and all((out / f).is_file() for f in summary["files"])
    group = next(g for g in summary["groups"]
                 if g["arch"] == "lenet" and g["protocol"] == "full")
    assert group["metrics"]["accuracy"] == pytest.approx({"mean": 0.85, "std": 0.1, "n": 3})
    assert group["repetitions"] == ["seed 1", "seed 2", "seed 3"]


def test_fraction_plot_only_for_groups_differing_by_fraction(runs_root, tmp_path):
    summary_file = tmp_path / "rep" / "summary.json"
    report_runs([runs_root], tmp_path / "rep")
    plots = json.loads(summary_file.read_text())["fraction_plots"]
    assert [p["file"] for p in plots] == ["fraction_macro_f1.png"]  # not augment, not CV
    curve = plots[0]["curves"]["tupac16"]["lenet"]
    assert [p["fraction"] for p in curve] == [0.1, 1.0]
    tenth = [_f1(TENTH["lenet", s]) for s in (1, 2)]
    assert curve[0]["mean"] == pytest.approx(np.mean(tenth))
    assert curve[0]["std"] == pytest.approx(np.std(tenth, ddof=1))
    png = tmp_path / "rep" / "fraction_macro_f1.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_groups_that_mix_settings_are_flagged(runs_root):
    runs = collect_runs([runs_root / "full"]).runs
    odd = replace(runs[0], other={**runs[0].other, "lr": 0.5})
    notes = group_warnings(group_runs([odd, *runs[1:]]))
    assert any("runs differ in lr" in n for n in notes)
    dup = group_warnings(group_runs([*runs, runs[0]]))
    assert any("appear(s) more than once" in n for n in dup)


def test_runs_of_two_protocol_revisions_are_flagged(real_run, tmp_path):
    from capsmed.train.protocol import PROTOCOL_REVISION

    new = make_run(real_run, tmp_path / "new", "lenet", 1, FULL["lenet", 1])
    old = make_run(real_run, tmp_path / "old", "lenet", 2, FULL["lenet", 2])
    config = yaml.safe_load((old / "config.yaml").read_text())
    assert config["environment"]["protocol_revision"] == PROTOCOL_REVISION >= 1
    del config["environment"]["protocol_revision"]  # as runs made before it was recorded
    (old / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    notes = group_warnings(group_runs(collect_runs([tmp_path]).runs))
    assert [n for n in notes if "revision" in n] == [
        f"tupac16 / full / lenet: runs of capsmed protocol revisions 0, {PROTOCOL_REVISION} "
        "are averaged together, but capsmed changed what such a run computes between "
        "them (capsmed/train/protocol.py); train the older runs again"]
    assert not any("differ in" in n for n in notes)
    assert not group_warnings(group_runs(collect_runs([new]).runs))


def test_a_report_older_than_the_kept_checkpoint_is_refused_and_shown_stale(real_run,
                                                                            tmp_path):
    run = make_run(real_run, tmp_path / "runs" / "a", "lenet", 1, FULL["lenet", 1])
    meta = json.loads((run / "checkpoint.json").read_text())
    report_path = run / "report" / "report.json"
    report = json.loads(report_path.read_text())
    assert report["checkpoint_epoch"] == meta["epoch"]
    def rep_column():
        ls = runner.invoke(app, ["runs", "ls", str(tmp_path / "runs")], terminal_width=80)
        assert ls.exit_code == 0, ls.output
        return next(line for line in ls.output.splitlines()
                    if line.lstrip().startswith("a ")).split()[-1]

    assert rep_column() == "yes"
    # the run trained on (--resume) after it was evaluated: a new kept epoch
    (run / "checkpoint.json").write_text(json.dumps({**meta, "epoch": meta["epoch"] + 3}))
    assert rep_column() == "stale"
    result = runner.invoke(app, ["report", str(tmp_path / "runs"), "-o", str(tmp_path / "r")])
    assert_clean_failure(result, f"{report_path}: scored the epoch {meta['epoch']} checkpoint, "
                         f"but the run now keeps epoch {meta['epoch'] + 3}")
    assert not (tmp_path / "r").exists()



def test_a_report_of_other_weights_at_the_same_epoch_is_refused_and_shown_stale(real_run,
                                                                                tmp_path):
    """Only the epoch was compared: a checkpoint retrained (or replaced) to the same
    epoch passed its old report off as current."""
    import torch

    from capsmed.runs.checkpoint import load_checkpoint
    from capsmed.train.checkpoint import save_checkpoint

    run = make_run(real_run, tmp_path / "runs" / "a", "lenet", 1, FULL["lenet", 1])
    report_path = run / "report" / "report.json"
    ls = runner.invoke(app, ["runs", "ls", str(tmp_path / "runs"), "--json"])
    assert ls.exit_code == 0 and json.loads(ls.output)[0]["report_stale"] is False
    model, meta = load_checkpoint(run)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    meta = {k: v for k, v in meta.items() if k != "weights_digest"}
    save_checkpoint(run, model, meta)  # the same epoch, other weights
    assert json.loads((run / "checkpoint.json").read_text())["epoch"] == meta["epoch"]
    ls = runner.invoke(app, ["runs", "ls", str(tmp_path / "runs"), "--json"])
    assert ls.exit_code == 0 and json.loads(ls.output)[0]["report_stale"] is True
    result = runner.invoke(app, ["report", str(tmp_path / "runs"), "-o", str(tmp_path / "r")])
    assert_clean_failure(result, f"{report_path}: scored other weights than the run's "
                         "checkpoint now holds")
    assert not (tmp_path / "r").exists()

def test_runs_ls_skips_broken_configs_and_reads_past_a_partial_metrics_line(real_run,
                                                                            tmp_path, caplog):
    from capsmed.runs.index import find_runs

    good = make_run(real_run, tmp_path / "good", "lenet", 1, FULL["lenet", 1])
    epochs = len((good / "metrics.jsonl").read_text().splitlines())
    with (good / "metrics.jsonl").open("a") as fh:
        fh.write('{"epoch": 9, "train_lo')  # a full disk cut the last record
    for name, text in (("empty", ""), ("list", "- 1\n"), ("no-train", "dataset: {}\n")):
        shutil.copytree(real_run, tmp_path / name)
        (tmp_path / name / "config.yaml").write_text(text)
    with caplog.at_level(logging.WARNING):
        runs = find_runs(tmp_path)
    assert [r.path.name for r in runs] == ["good"] and runs[0].epochs_run == epochs
    assert sorted(m.split(":")[0] for m in caplog.messages) == sorted(
        str(tmp_path / n) for n in ("empty", "list", "no-train"))
    # a run or report being written (a hidden staging folder) is not a second run
    shutil.copytree(good, tmp_path / ".good.x1y2z3.partial")
    assert [r.path.name for r in find_runs(tmp_path)] == ["good"]


def test_runs_ls_shows_unfinished_runs_even_before_their_first_epoch(real_run, tmp_path):
    from capsmed.runs.index import find_runs

    run = tmp_path / "cut"
    shutil.copytree(real_run, run)
    (run / "resume.pt").write_bytes(b"state")  # interrupted in its first epoch
    (run / "metrics.jsonl").unlink()
    (summary,) = find_runs(tmp_path)
    planned = yaml.safe_load((run / "config.yaml").read_text())["train"]["epochs"]
    assert (summary.epochs_run, summary.epochs_planned) == (0, planned)
    ls = runner.invoke(app, ["runs", "ls", str(tmp_path)], terminal_width=80)
    assert ls.exit_code == 0 and f" 0/{planned} " in ls.output


def test_val_split_and_other_data_are_labelled_apart(runs_root, tmp_path):
    from capsmed.evaluate.aggregate import load_evaluated_run

    run = tmp_path / "run"
    shutil.copytree(runs_root / "full" / "lenet-s1", run)
    report = json.loads((run / "report" / "report.json").read_text())
    (run / "report" / "report.json").write_text(json.dumps({**report, "split": "val"}))
    assert load_evaluated_run(run).dataset == "tupac16 (val)"
    (run / "report" / "report.json").write_text(json.dumps({**report, "dataset": "other"}))
    assert load_evaluated_run(run).dataset == "tupac16->other"
    # a cross-validation file scored whole (--split all) holds the training rows too
    (run / "report" / "report.json").write_text(json.dumps({**report, "split": "all"}))
    assert load_evaluated_run(run).dataset == "tupac16 (all)"
    # another file under the same dataset name: told apart by its content digest
    assert report["data_digest"].startswith("sha256:")
    other = {**report, "data": "/d/tupac16_v2.h5", "data_digest": "sha256:" + "0" * 64}
    (run / "report" / "report.json").write_text(json.dumps(other))
    assert load_evaluated_run(run).dataset == "tupac16->tupac16_v2"


def test_runs_trained_on_different_files_of_one_name_are_not_averaged(runs_root):
    runs = [r for r in collect_runs([runs_root / "full"]).runs if r.arch == "lenet"]
    assert len({r.data_file for r in runs}) == 1 and runs[0].data_file.startswith("sha256:")
    remade = replace(runs[0], data_file="sha256:" + "ab" * 32, data_name="remade.h5")
    groups = group_runs([remade, *runs[1:]])
    assert sorted((g.dataset, len(g.runs)) for g in groups) == [
        ("tupac16 [remade.h5 abababab]", 1),
        (f"tupac16 [{runs[1].data_name} {runs[1].data_file[7:15]}]", len(runs) - 1)]


def test_stratified_folds_with_equal_class_counts_are_summed_in_the_images_column(
        runs_root):
    """Equal per-class test counts do not mean one test set: CV folds hold other images."""
    from capsmed.evaluate.layouts import per_class_tables

    base = collect_runs([runs_root / "cv"]).runs[0]
    folds = [replace(base, fold=f, confusion=np.asarray(cm)) for f, cm in
             enumerate([[[8, 2], [1, 9]], [[7, 3], [2, 8]], [[9, 1], [0, 10]]])]
    table = per_class_tables(group_runs(folds), "pooled")[0]
    assert [row[1] for row in table.rows] == ["30", "30", "60"]
    assert any("every image once" in n for n in table.notes)


def test_folds_whose_held_out_rows_overlap_under_a_per_class_limit_are_not_every_image_once(
        runs_root, tmp_path):
    """With --per-class-limit, the images beyond the limit are in every fold's test set
    (paper 001's small-data protocol): summed over the folds they count once per fold,
    yet the notes said every image was counted once."""
    from capsmed.evaluate.layouts import per_class_tables

    base = collect_runs([runs_root / "cv"]).runs[0]
    folds = []
    for f, cm in enumerate([[[8, 2], [1, 9]], [[7, 3], [2, 8]]]):
        run = tmp_path / f"f{f}"
        run.mkdir()
        np.save(run / "test_indices.npy", np.r_[[f, 2 + f], np.arange(4, 20)])  # 4.. shared
        folds.append(replace(base, path=run, fold=f, confusion=np.asarray(cm),
                             settings={**base.settings, "per_class_limit": 2}))
    notes = " ".join(per_class_tables(group_runs(folds), "pooled")[0].notes)
    assert "every image once" not in notes and "every image counts once" not in notes
    assert "count once per run" in notes
    # the same limit with disjoint held-out rows (no image beyond it): every image once
    for f, run in enumerate(r.path for r in folds):
        np.save(run / "test_indices.npy", np.arange(10 * f, 10 * f + 10))
    notes = " ".join(per_class_tables(group_runs(folds), "pooled")[0].notes)
    assert "every image once" in notes and "per-class limit" not in notes



def test_a_class_named_total_keeps_its_own_row_in_the_per_class_table(runs_root):
    """The row of a class named 'Total' was taken for the total row: it showed the
    macro means (and all the images) instead of the class's own numbers."""
    from capsmed.evaluate.layouts import per_class_tables

    base = collect_runs([runs_root / "cv"]).runs[0]
    run = replace(base, class_names=("Total", "other"), confusion=np.array([[8, 2], [1, 9]]))
    table = per_class_tables(group_runs([run]), "pooled")[0]
    assert [row[:4] for row in table.rows] == [["Total", "10", "0.889", "0.800"],
                                               ["other", "10", "0.818", "0.900"],
                                               ["Total", "20", "0.854", "0.850"]]

def test_latex_escaping():
    assert latex_escape("a_b 50% & c->d ± x") == "a\\_b 50\\% \\& c$\\rightarrow$d $\\pm$ x"
    from capsmed.tables import Column, Table

    assert "\\toprule" in latex([Table("t", [Column("a"), Column("b")], [["1", "2"]])])


def _ok(args):
    result = runner.invoke(app, ["-q", *args], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output + str(result.exception)
    return result




def test_cli_end_to_end(runs_root, tmp_path):
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", str(runs_root), "-o", str(out)],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output + str(result.exception)
    assert "Macro F1: mean ± std" in result.output
    assert "precision and sensitivity per class, pooled" in result.output
    assert "paired t-test" in result.output
    assert "13 run(s) in 6 group(s), 1 skipped" in result.output
    assert "lenet-s9: skipped" in result.stderr and "capsmed evaluate" in result.stderr
    for name in ("summary.json", "table_macro_f1.md", "table_macro_f1.csv",
                 "table_macro_f1.tex", "per_class_pooled.tex", "per_class_mean.csv",
                 "significance_macro_f1.tex", "groups.csv", "fraction_macro_f1.png"):
        assert (out / name).is_file(), name
    assert not list(tmp_path.glob(".report.*")), "staging folder left behind"
    # a second report replaces the first whole: no stale files from the old metric
    _ok(["report", str(runs_root / "full"), "-o", str(out), "--metric", "accuracy",
         "--test", "wilcoxon", "--per-class", "mean"])
    assert (out / "table_accuracy.md").is_file() and not (out / "table_macro_f1.md").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["options"]["test"] == "wilcoxon" and len(summary["runs"]) == 7
    assert not list(tmp_path.glob(".report.*"))


@pytest.mark.parametrize("args, text", [
    (["--metric", "auc"], "--metric auc: not in the reports"),
    (["--test", "anova"], "--test must be one of ttest, wilcoxon"),
    (["--arch", "resnext50"], "--arch resnext50: no evaluated run"),
])
def test_cli_bad_options_write_nothing(runs_root, tmp_path, args, text):
    out = tmp_path / "rep"
    result = runner.invoke(app, ["report", str(runs_root / "full"), "-o", str(out), *args])
    assert_clean_failure(result, text)
    assert not out.exists() and not list(tmp_path.glob(".rep.*"))


def test_cli_refuses_foreign_folder_and_no_runs(runs_root, tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    result = runner.invoke(app, ["report", str(runs_root / "full"), "-o", str(foreign)])
    assert_clean_failure(result, f"{foreign}: exists, is not empty")
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    result = runner.invoke(app, ["report", str(runs_root / "pending"), "-o",
                                 str(tmp_path / "r")])
    assert result.exit_code == 1 and "capsmed evaluate" in result.stderr  # the warning
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"error: {runs_root / 'pending'}: no evaluated runs (1 skipped)")
    result = runner.invoke(app, ["report", str(tmp_path / "nowhere"), "-o",
                                 str(tmp_path / "r")])
    assert_clean_failure(result, f"{tmp_path / 'nowhere'}: no such run directory")
    assert not (tmp_path / "r").exists()
    broken = tmp_path / "broken"
    shutil.copytree(runs_root / "full" / "lenet-s1", broken / "run")
    (broken / "run" / "report" / "report.json").write_text("{not json")
    result = runner.invoke(app, ["report", str(broken), "-o", str(tmp_path / "r")])
    assert_clean_failure(result, f"{broken / 'run' / 'report' / 'report.json'}: cannot read")


def test_runs_ls_and_report_share_one_protocol_label():
    from capsmed.runs.index import _protocol

    train = {"per_class_limit": 25, "augment": True, "fold": 2, "folds": 5}
    assert _protocol(train, {}) == protocol_label(protocol_settings(train)) + ", fold 2"
    assert "per-class limit 25" in _protocol(train, {})
    assert "augment default" in _protocol(train, {})
    assert _protocol({"fold": 2}, {"folds": 5}) == "5-fold CV, fold 2"
    moved = protocol_settings({"transfer_from": "runs/a", "transfer_layers": ["conv"]})
    assert protocol_label(moved) == "transferred conv (frozen)"
    assert protocol_settings({"freeze_transferred": False}) == protocol_settings({})


def test_runs_transferred_from_different_sources_are_not_repetitions(tmp_path):
    """Layers from a bloodmnist lenet and from a pathmnist lenet were one cell, n=4."""
    from capsmed.runs.index import _protocol
    from capsmed.train.protocol import transfer_source

    for name, dataset in (("blood", "bloodmnist"), ("path", "pathmnist")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(
            f"train: {{arch: lenet}}\ndataset: {{name: {dataset}}}\n")
    labels = {_protocol({"transfer_from": str(tmp_path / n), "transfer_layers": ["features"]})
              for n in ("blood", "path")}
    assert labels == {"transferred features from lenet on bloodmnist (frozen)",
                      "transferred features from lenet on pathmnist (frozen)"}
    gone = {"transfer_from": str(tmp_path / "gone"), "transfer_layers": ["features"]}
    assert transfer_source(gone) == "gone"  # the folder's name still tells them apart
    assert transfer_source({"transfer_from": None}) is None


def test_the_terminal_table_shows_labels_with_brackets_and_keeps_numbers_whole():
    """`tupac16 [tupac16.h5 5e125ea9]` is a label, not rich markup; and in 80 columns the
    label column wraps, never a number."""
    from rich.console import Console

    from capsmed.tables import Column, Table, text_column
    from capsmed.tables.terminal import to_rich

    label = "tupac16 [tupac16.h5 5e125ea9]"
    table = Table(title=f"{label} / full",
                  columns=[text_column("Dataset"), *(Column(f"m{i}") for i in range(8))],
                  rows=[[label, *(f"-0.{i}23 ± 0.045" for i in range(8))]])
    console = Console(width=80, record=True)
    console.print(to_rich(table, 80))
    text = console.export_text()
    assert "[tupac16.h5" in text and "5e125ea9]" in text
    for i in range(8):
        assert f"-0.{i}23" in text and text.count("0.045") == 8


def _whole_name(shown: str, name: str) -> bool:
    """``shown`` is ``name`` or whole parts of it around '…' (never a word cut)."""
    import re

    parts = re.findall(r"[^-_/ :]+[-_/ :]*|[-_/ :]+", name)
    pieces = [p for p in shown.split("…") if p]
    return shown == name or ("…" in shown and all(
        any("".join(parts[i:j]) == piece for i in range(len(parts))
            for j in range(i + 1, len(parts) + 1)) for piece in pieces))


def test_runs_ls_at_80_columns_shortens_run_names_never_splits_them(real_run, tmp_path):
    """Issue 23: `runs ls` split run names mid-word over two lines at 80 columns."""
    names = [f"tupac16-{arch}-fraction-0.1-seed{seed}-{digest}" for arch, seed, digest in
             (("capsnet", 1, "057f80bb72f2"), ("capsnet", 2, "cc26506c1c5b"),
              ("lenet", 1, "0f7a499c0fc5"))]
    for name in names:
        make_run(real_run, tmp_path / "study" / "runs" / name, name.split("-")[1], 1,
                 FULL["lenet", 1], fraction=0.1)
    ls = runner.invoke(app, ["runs", "ls", str(tmp_path)], terminal_width=80)
    assert ls.exit_code == 0, ls.output
    lines = ls.output.splitlines()
    assert max(map(len, lines)) <= 80
    rows = [line for line in lines if line.split() and line.split()[-1] in ("yes", "no")]
    assert len(rows) == 3
    for row, name in zip(rows, names, strict=True):
        shown = row.split()[0]
        assert _whole_name(shown, f"study/runs/{name}"), row
        assert name.split("-")[1] in row and f"seed{name.split('seed')[1][0]}" in shown


def test_report_at_80_columns_keeps_every_header_and_number_whole(runs_root, tmp_path):
    """Issue 23: the paired-test table cut 'Dataset' to 'Datas/et', 'capsnet' to
    'capsne/t' and ran past 80 columns."""
    result = runner.invoke(app, ["report", str(runs_root), "-o", str(tmp_path / "r")],
                           terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80
    header = next(line for line in lines if line.startswith("Dataset  Protocol"))
    assert header.split()[:4] == ["Dataset", "Protocol", "A", "B"]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    for t in summary["significance"]["tests"]:
        if t["p_value"] is not None:  # its row: both archs and p, each whole
            p = "<0.0001" if t["p_value"] < 1e-4 else f"{t['p_value']:.4f}"
            assert any({t["arch_a"], t["arch_b"], p} <= set(line.split())
                       for line in lines), p
    means = [f"{g['metrics']['macro_f1']['mean']:.3f}" for g in summary["groups"]]
    body = "\n".join(lines)
    assert all(m in body for m in means)
    # the main table (issue 23: squeezed to a 21-character column) is shown in parts if
    # need be, each row on one line: its label whole, then whole 'mean ± std (n=N)' cells
    main = lines[lines.index("Macro F1: mean ± std over repetitions (paper 000 Table 2 "
                             "layout)"):]
    end = next(i for i, line in enumerate(main) if line.startswith("'-': no evaluated"))
    rows = [line for line in main[:end] if line.startswith("tupac16 ")]
    for group in summary["groups"]:
        f1 = group["metrics"]["macro_f1"]
        if f1.get("std") is not None:
            cell = f"{f1['mean']:.3f} ± {f1['std']:.3f} (n={f1['n']})"
            assert any(cell in row for row in rows), (cell, rows)


def test_a_p_value_is_never_rounded_across_alpha_beside_its_mark():
    """p = 0.04996 was shown ``0.0500`` with its ``*`` under ``p<0.05``: a p-value that
    reads as not significant, marked significant."""
    from capsmed.evaluate.layouts import significance_table
    from capsmed.evaluate.significance import PairedTest

    tests = [PairedTest("d", "full", "capsnet", "lenet", "macro_f1", "wilcoxon", 8, 0.9,
                        0.8, 0.1, 1.0, p, p < 0.05) for p in (0.04996, 0.3, 0.05)]
    table = significance_table(tests, [], "wilcoxon", 0.05)
    assert [row[-2:] for row in table.rows] == [["0.04996", "*"], ["0.3000", ""],
                                                ["0.0500", ""]]
    assert table.csv_rows[0][11] == 0.04996  # the CSV keeps the number as computed


def test_the_wilcoxon_note_counts_the_pairs_that_differ():
    """scipy drops zero differences: 6 pairs with one tie test 5, which cannot reach
    p < 0.05, and no note said so (it counted 6)."""
    a = [0.90, 0.91, 0.92, 0.93, 0.94, 0.95]
    b = [0.80, 0.82, 0.83, 0.85, 0.86, 0.95]  # the last pair ties
    _, p, note = paired_p_value(a, b, "wilcoxon")
    assert p == pytest.approx(stats.wilcoxon(np.subtract(a, b)[:5]).pvalue)
    assert "with 5 non-zero differences (of 6 pairs) the Wilcoxon test cannot reach " \
           "p < 0.05" in note
    assert paired_p_value(a[:5] + [0.99], b, "wilcoxon")[2] == ""  # 6 that differ
