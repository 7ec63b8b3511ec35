"""benchmarks/study_throughput.py at toy size: every figure it reports is there and
made from the runs it trained (the speed itself is measured on a GPU, not here)."""

from __future__ import annotations

import json

from benchmarks import study_throughput


def test_study_throughput_reports_each_architecture_and_the_paper_study(tmp_path):
    result = study_throughput.main(["--workdir", str(tmp_path), "--toy", "--runs", "1",
                                    "--epochs", "2", "--archs", "lenet", "capsnet",
                                    "--mode", "lenet=eager+augment"])
    assert set(result["archs"]) == {"lenet", "capsnet"}
    for figures in result["archs"].values():
        assert figures["runs"] == 1 and figures["images_per_s"] > 0
        assert 0 < figures["epoch_s_per_run"] < result["study_wall_s"]
        assert figures["outside_epochs_s_per_run"] > 0 and figures["checkpoint_s_per_run"] > 0
        [run] = figures["per_run"]
        assert len(run["epoch_seconds"]) == 2
        # one run: a later run is taken to pay what the first paid
        assert figures["first_run_overhead_s"] == figures["later_run_overhead_s"] > 0
    assert result["archs"]["lenet"]["mode"] == "eager+augment"
    assert result["archs"]["capsnet"]["mode"] == "eager"
    assert 0 < result["busy_fraction"] < 1
    # 288 of paper 000's 432 runs are capsnet or lenet, half of each augmented: lenet's
    # augmented 72 and capsnet's other 72 are covered; the baseline's are not
    assert result["paper000_runs_covered"] == "144 of 432"
    assert result["paper000_gpu_hours"] > 0
    saved = json.loads((tmp_path / "study_throughput.json").read_text())
    assert saved["archs"] == result["archs"]
    assert saved["modes"] == {"lenet": ["eager+augment"]}


def test_a_bad_mode_is_refused_before_anything_runs(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        study_throughput.main(["--workdir", str(tmp_path), "--toy", "--mode", "lenet=fast"])
    assert "MODE one of eager, compile, graph, compile+graph, eager+augment" in \
        capsys.readouterr().err
    assert not (tmp_path / "data").exists()
    # one epoch: its rate, compilation included, was reported as the steady rate
    with pytest.raises(SystemExit):
        study_throughput.main(["--workdir", str(tmp_path), "--toy", "--epochs", "1"])
    assert "--epochs must be 2 or more, got 1" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()
    # a mode of an architecture not trained: listed among the modes, measured never
    with pytest.raises(SystemExit):
        study_throughput.main(["--workdir", str(tmp_path), "--toy", "--archs", "lenet",
                               "--mode", "capsnet=compile"])
    assert "--mode capsnet=compile: capsnet is not among --archs (lenet)" in \
        capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_runs_sharing_the_gpu_run_each_architecture_alone(tmp_path):
    """--runs-per-gpu: one capsmed run per architecture (so only its runs share), the
    first K runs counted as first runs, and the extrapolation over K runs in flight."""
    result = study_throughput.main(["--workdir", str(tmp_path), "--toy", "--runs", "2",
                                    "--epochs", "2", "--archs", "lenet",
                                    "--runs-per-gpu", "2"])
    figures = result["archs"]["lenet"]
    assert result["runs_per_gpu"] == figures["runs_per_gpu"] == 2 and figures["runs"] == 2
    # both runs are first runs (one per worker); with no later run, a later run pays that
    assert figures["later_run_overhead_s"] == figures["first_run_overhead_s"] == \
        sum(r["overhead_s"] for r in figures["per_run"]) / 2
    alone = study_throughput.paper_study_hours({"lenet": {**figures, "runs_per_gpu": 1}})
    assert abs(result["paper000_gpu_hours"] - alone[0] / 2) < 1e-9 * alone[0]
    assert "runs per GPU: 2" in study_throughput.table(result)


def _row(started: float, wall_s: float, epoch_seconds: list[float]) -> dict:
    return {"arch": "lenet", "mode": "eager", "started": started, "wall_s": wall_s,
            "epoch_s": sum(epoch_seconds), "epoch_seconds": epoch_seconds,
            "epochs": len(epoch_seconds), "train_samples": 1000,
            "train_images": 1000 * len(epoch_seconds), "checkpoint_writes": 1,
            "checkpoint_write_s": 0.5, "batch_size": 128}


def test_the_extrapolation_matches_a_hand_computation():
    """Three made-up lenet runs: steady rate 6,000 images / 60 s = 100 img/s; overheads
    (first-epoch extra + wall - epochs) 20+50 = 70 (started first), 10+30 = 40, 2+28 =
    30. jimenez2018 has 144 lenet runs of 50 epochs over 36 x (55k + 55k + 60k + 50k)
    training images: 396M images, 3,960,000 s at 100 img/s. With K runs sharing the
    GPU, each of the K workers pays the first run's overhead once (it counted once).
    Half of the runs augment: they count at an augmented figure (here the same one
    under its other key, so the first run's overhead counts once for each key)."""
    import copy

    rows = [_row(0.0, 100.0, [30.0, 10.0, 10.0]), _row(100.0, 60.0, [12.0, 10.0, 10.0]),
            _row(50.0, 70.0, [20.0, 10.0, 10.0])]
    alone = study_throughput.per_arch(copy.deepcopy(rows), {"*": 200.0})["lenet"]
    assert alone["images_per_s"] == 100.0 and alone["first_run_overhead_s"] == 70.0
    assert alone["later_run_overhead_s"] == 35.0 and alone["busy_share_of_study"] == 0.61
    hours, covered, total = study_throughput.paper_study_hours(_both(alone))
    assert (covered, total) == (144, 432)
    assert abs(hours - (3_960_000 + 2 * 70 + 142 * 35) / 3600) < 1e-9
    shared = study_throughput.per_arch(copy.deepcopy(rows), {"lenet": 200.0}, 2)["lenet"]
    assert shared["first_run_overhead_s"] == 55.0 and shared["later_run_overhead_s"] == 30.0
    assert shared["busy_share_of_study"] == 122 / 400
    hours, _, _ = study_throughput.paper_study_hours(_both(shared))
    assert abs(hours - (3_960_000 + 4 * 55 + 140 * 30) / 2 / 3600) < 1e-9


def _both(figure: dict) -> dict:
    return {f"lenet {mode}": {**figure, "arch": "lenet", "mode": mode}
            for mode in ("eager", "eager+augment")}


def test_a_rate_covers_only_the_runs_that_train_in_its_mode():
    """A rate counts the runs the study trains in its mode (--set gpu_modes=true:
    capsnet compiled and graphed, lenet graphed), augmented or not as it was measured:
    the augmented runs' draws are launches of their own, outside the graph. Half of
    each architecture's 144 runs augment (the medical sets but `noaug`, the digit sets'
    `aug`)."""
    fig = {"mode": "graph", "images_per_s": 100.0, "first_run_overhead_s": 0.0,
           "later_run_overhead_s": 0.0}
    hours = {}
    for mode in ("eager", "graph", "graph+augment"):
        hours[mode], covered, total = study_throughput.paper_study_hours(
            {"lenet": {**fig, "mode": mode}})
        assert (covered, total) == (72, 432), mode
    # the same runs' images at the same rate (the other half has as many: 198M)
    assert hours["graph"] == hours["eager"] == hours["graph+augment"]
    for mode in ("compile", "graph", "compile+augment"):  # not capsnet's study modes
        assert study_throughput.paper_study_hours({"capsnet": {**fig, "mode": mode}})[1] == 0
    for mode in ("compile+graph+augment", "eager+augment"):  # gpu_modes, or without
        assert study_throughput.paper_study_hours(
            {"capsnet": {**fig, "mode": mode}})[1] == 72


def test_an_architecture_measured_in_two_modes_counts_each_run_at_its_own():
    """--mode lenet=graph --mode lenet=graph+augment: lenet's 72 plain runs at the
    graph rate, its 72 augmented runs at the augmented one; 396M training images in
    all over 50 epochs, split by hand: 36 runs of each digit set, 32 of them plain, 4
    augmented (`aug`), 55k images each; 36 TUPAC16 runs (60k) and 36 DIARETDB1 runs
    (50k), 4 of each plain (`noaug`, iterations of the full split)."""
    fig = {"first_run_overhead_s": 0.0, "later_run_overhead_s": 0.0}
    figures = {"lenet graph": {**fig, "arch": "lenet", "mode": "graph", "images_per_s": 200.0},
               "lenet graph+augment": {**fig, "arch": "lenet", "mode": "graph+augment",
                                       "images_per_s": 100.0}}
    hours, covered, _ = study_throughput.paper_study_hours(figures)
    assert covered == 144
    plain = 50 * (64 * 55_000 + 4 * 60_000 + 4 * 50_000)
    augmented = 50 * (8 * 55_000 + 32 * 60_000 + 32 * 50_000)
    assert plain + augmented == 396_000_000
    assert abs(hours - (plain / 200 + augmented / 100) / 3600) < 1e-9


def test_two_modes_of_one_architecture_train_on_other_seeds(tmp_path):
    """A mode is not part of a run's identity: the same seed in two modes would be one
    run (refused as a duplicate), so each mode gets its own seeds."""
    import argparse

    import yaml

    args = argparse.Namespace(archs=["lenet", "capsnet"], runs=2, epochs=2, batch_size=32,
                              device="cpu", precision="auto", compile=False,
                              cuda_graph=False, toy=True, fresh_processes=False,
                              runs_per_gpu=1, mode={"lenet": ["graph", "eager"]})
    raw = yaml.safe_load(study_throughput.pipeline_file(tmp_path, tmp_path / "d.h5",
                                                        args).read_text())
    blocks = [(b["arch"], b.get("mode"), b["seed"]) for b in raw["grid"]]
    assert blocks == [(["capsnet"], None, [0, 1]), (["lenet"], ["graph"], [0, 1]),
                      (["lenet"], ["eager"], [2, 3])]
