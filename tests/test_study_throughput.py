"""benchmarks/study_throughput.py at toy size: every figure it reports is there and
made from the runs it trained (the speed itself is measured on a GPU, not here)."""

from __future__ import annotations

import json

from benchmarks import study_throughput


def test_study_throughput_reports_each_architecture_and_the_paper_study(tmp_path):
    result = study_throughput.main(["--workdir", str(tmp_path), "--toy", "--runs", "1",
                                    "--epochs", "2", "--archs", "lenet", "capsnet",
                                    "--mode", "lenet=eager"])
    assert set(result["archs"]) == {"lenet", "capsnet"}
    for figures in result["archs"].values():
        assert figures["runs"] == 1 and figures["images_per_s"] > 0
        assert 0 < figures["epoch_s_per_run"] < result["study_wall_s"]
        assert figures["outside_epochs_s_per_run"] > 0 and figures["checkpoint_s_per_run"] > 0
        [run] = figures["per_run"]
        assert len(run["epoch_seconds"]) == 2 and figures["mode"] == "eager"
        # one run: a later run is taken to pay what the first paid
        assert figures["first_run_overhead_s"] == figures["later_run_overhead_s"] > 0
    assert 0 < result["busy_fraction"] < 1
    # 288 of paper 000's 432 runs are capsnet or lenet; the baseline's are not covered
    assert result["paper000_runs_covered"] == "288 of 432"
    assert result["paper000_gpu_hours"] > 0
    saved = json.loads((tmp_path / "study_throughput.json").read_text())
    assert saved["archs"] == result["archs"] and saved["modes"] == {"lenet": "eager"}


def test_a_bad_mode_is_refused_before_anything_runs(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        study_throughput.main(["--workdir", str(tmp_path), "--toy", "--mode", "lenet=fast"])
    assert "MODE one of eager, compile, graph, compile+graph" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()
