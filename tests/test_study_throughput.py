"""benchmarks/study_throughput.py at toy size: every figure it reports is there and
made from the runs it trained (the speed itself is measured on a GPU, not here)."""

from __future__ import annotations

import json

from benchmarks import study_throughput


def test_study_throughput_reports_each_architecture_and_the_paper_study(tmp_path):
    result = study_throughput.main(["--workdir", str(tmp_path), "--toy", "--runs", "1",
                                    "--epochs", "1", "--archs", "lenet", "capsnet"])
    assert set(result["archs"]) == {"lenet", "capsnet"}
    for figures in result["archs"].values():
        assert figures["runs"] == 1 and figures["images_per_s"] > 0
        assert 0 < figures["epoch_s_per_run"] < result["study_wall_s"]
        assert figures["outside_epochs_s_per_run"] > 0 and figures["checkpoint_s_per_run"] > 0
    assert 0 < result["busy_fraction"] < 1
    # 288 of paper 000's 432 runs are capsnet or lenet; the baseline's are not covered
    assert result["paper000_runs_covered"] == "288 of 432"
    assert result["paper000_gpu_hours"] > 0
    saved = json.loads((tmp_path / "study_throughput.json").read_text())
    assert saved["archs"] == result["archs"]
