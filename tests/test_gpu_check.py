"""benchmarks/gpu_check.py at toy size on the CPU: every part runs and reports."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu_check
from capsmed.models import list_models
from capsmed.models.compiled import routing_compile_enabled


def _records(out):
    return [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_quick_cpu_run_exercises_every_part(tmp_path):
    assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path),
                           "--archs", "capsnet,lenet"]) == 0
    records = _records(tmp_path)
    assert {r["part"] for r in records} == {*gpu_check.PARTS, "reference"}
    assert all(r.get("ok", True) for r in records)
    correctness = [r for r in records if r["part"] == "correctness"]
    assert len(correctness) == 3 * len(list_models())  # forward, fp32, bf16 per model
    assert all(r["rel_error"] == 0.0 for r in correctness if r["check"] == "forward")
    trained = [r for r in correctness if r["check"].startswith("train")]
    assert all(r["last_loss"] < r["first_loss"] for r in trained)
    demo = {r["name"]: r for r in records if r["part"] == "demo"}
    assert demo["train"]["ok"] and demo["evaluate"]["ok"]
    (ddp,) = [r for r in records if r["part"] == "ddp"]
    assert ddp["backend"] == "gloo" and ddp["max_rel_diff"] <= 1e-5
    speed = [r for r in records if r["part"] == "speed"]
    eager = [r for r in speed if r["mode"].startswith("eager")]
    assert len(eager) == 4 and all(r["train_images_per_s"] > 0 for r in eager)
    assert all(r["skipped"] == "CUDA only" for r in speed if r not in eager)
    md = (tmp_path / "gpu_check.md").read_text()
    for title in ("## Correctness", "## Demo chain on cpu", "## torchrun against one process",
                  "## Training throughput", "## Concurrent", "mitosis"):
        assert title in md
    assert "all checks passed" in md


def test_train_modes_part_trains_and_resumes_through_capsmed_train(tmp_path, monkeypatch):
    from benchmarks import gpu_check_train

    monkeypatch.setattr(gpu_check_train, "EPOCHS", 2)
    assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path),
                           "--parts", "train-modes"]) == 0
    records = {r["name"]: r for r in _records(tmp_path) if r["part"] == "train-modes"}
    assert set(records) == {f"{m} {p}" for m, p in gpu_check_train.MODES} | {
        "eager fp32 resumed"}
    eager = records["eager fp32"]
    assert eager["ok"] and eager["max_rel_diff"] == 0.0 and len(eager["losses"]) == 4
    assert eager["losses"][-2] < eager["losses"][0]  # it learns
    resumed = records["eager fp32 resumed"]
    assert resumed["ok"] and resumed["max_rel_diff"] == resumed["weights_rel_diff"] == 0.0
    skipped = [r for r in records.values() if "skipped" in r]
    assert len(skipped) == len(gpu_check_train.MODES) - 1  # the GPU modes, on a CPU
    assert "## capsmed train in each mode" in (tmp_path / "gpu_check.md").read_text()


def test_a_failed_check_fails_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "FORWARD_TOLERANCE", -1.0)  # nothing can pass
    capsnet = [e for e in list_models() if e.name == "capsnet"]
    monkeypatch.setattr(gpu_check, "list_models", lambda: capsnet)  # one is enough
    assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path),
                           "--parts", "correctness"]) == 1
    assert "check(s) FAILED" in (tmp_path / "gpu_check.md").read_text()
    assert "correctness: capsnet" in capsys.readouterr().out


def test_speed_cells_run_breadth_first_so_a_budget_cuts_large_batches_last():
    archs = list(gpu_check.SPEED_ARCHS)
    plan = gpu_check.speed_schedule(archs, quick=False)
    cells = [c for c in plan if c[0] != "reference"]
    first = {a: gpu_check.batch_sizes(a, False)[0] for a in archs}
    assert len(cells) == len(set(cells)) == sum(
        len(gpu_check.MODES) * len(gpu_check.batch_sizes(a, False)) for a in archs)
    # every architecture's cheap eager cells, then its compiled and graph cells, all at
    # its first batch, come before any cell at a second batch
    head = cells[:len(archs) * len(gpu_check.MODES)]
    assert head[:2 * len(archs)] == [(a, m, first[a]) for a in archs
                                     for m in ("eager-fp32", "eager-bf16")]
    assert {(a, m, bs) for a, m, bs in head} == {(a, m, first[a]) for a in archs
                                                  for m in gpu_check.MODES}
    # the yardstick at each capsnet batch comes right after capsnet's last cell there
    for bs in gpu_check.batch_sizes("capsnet", False):
        i = plan.index(("reference", "", bs))
        assert plan[i - 1] == ("capsnet", "graph-bf16", bs)


def test_from_batch_goes_on_where_an_earlier_budget_stopped():
    archs = ["capsnet", "lenet", "resnext50"]
    full = gpu_check.speed_schedule(archs, quick=False)
    later = gpu_check.speed_schedule(archs, quick=False, first=2)
    second = {a: gpu_check.batch_sizes(a, False)[1:] for a in archs}
    assert later == [c for c in full if c[0] == "reference" and c[2] != 256
                     or c[0] != "reference" and c[2] in second[c[0]]]
    assert ("resnext50", "eager-fp32", 64) in later
    assert not any(bs == gpu_check.batch_sizes(a, False)[0] for a, _, bs in later
                   if a != "reference")
    # resnext50 has two sizes: a third batch leaves only the 28 px networks
    assert {a for a, _, _ in gpu_check.speed_schedule(archs, False, first=3)} == {
        "capsnet", "lenet", "reference"}


def test_from_batch_past_every_size_is_a_one_line_error(tmp_path, capsys):
    assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path),
                           "--parts", "speed", "--archs", "lenet", "--from-batch", "2"]) == 1
    assert "--from-batch 2: none of lenet has that many batch sizes" in capsys.readouterr().err
    assert not (tmp_path / "gpu_check.md").exists()


def test_a_spent_budget_skips_every_speed_cell_and_still_reports(tmp_path):
    assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path),
                           "--parts", "speed", "--archs", "capsnet,lenet",
                           "--budget-s", "0"]) == 0
    speed = [r for r in _records(tmp_path) if r["part"] == "speed"]
    assert len(speed) == 2 * len(gpu_check.MODES)
    assert all("skipped" in r and "train_images_per_s" not in r for r in speed)
    assert "time budget" in (tmp_path / "gpu_check.md").read_text()


def test_unknown_part_and_missing_cuda_are_one_line_errors(tmp_path, capsys):
    assert gpu_check.main(["--device", "cpu", "--parts", "speed,warp", "--out",
                           str(tmp_path)]) == 1
    assert "unknown part(s) warp" in capsys.readouterr().err


@pytest.mark.parametrize("value, enabled", [(None, True), ("1", True), ("0", False),
                                            ("off", False), ("no", False)])
def test_routing_compile_switch(monkeypatch, value, enabled):
    if value is None:
        monkeypatch.delenv("CAPSMED_COMPILE_ROUTING", raising=False)
    else:
        monkeypatch.setenv("CAPSMED_COMPILE_ROUTING", value)
    assert routing_compile_enabled() is enabled


def test_a_crashed_speed_part_restores_dynamic_shapes_for_the_later_parts(tmp_path,
                                                                          monkeypatch):
    """The speed part turns dynamo's automatic dynamic shapes off; a cell that raised
    (not out of memory) left it off for the memory and concurrent parts after it."""
    import torch

    def crash(*args, **kwargs):
        raise RuntimeError("a cell failed")

    monkeypatch.setattr(gpu_check, "bench_cell", crash)
    assert torch._dynamo.config.automatic_dynamic_shapes is True  # dynamo's default
    try:
        assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path),
                               "--parts", "speed", "--archs", "lenet"]) == 1
        assert any(r["name"] == "crashed" for r in _records(tmp_path))
        assert torch._dynamo.config.automatic_dynamic_shapes is True
    finally:
        torch._dynamo.config.automatic_dynamic_shapes = True


def test_the_speed_table_says_the_steps_and_sizes_it_timed(tmp_path):
    """--quick times 2 steps at toy sizes; the table's note said 20 timed steps at the
    paper's input sizes."""
    assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path),
                           "--parts", "speed", "--archs", "lenet"]) == 0
    note = " ".join((tmp_path / "gpu_check.md").read_text().split())
    assert "Toy widths and sizes (--quick);" in note and "; 2 timed steps after" in note
    assert "Paper input sizes" not in note and "20 timed steps" not in note
