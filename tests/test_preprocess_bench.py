"""benchmarks/preprocess.py at toy size: its figures describe the run they time."""

from __future__ import annotations

import os

from benchmarks import preprocess as bench
from capsmed.data.pool import default_workers
from capsmed.data.sources.diaretdb1.synth import write_diaretdb1


def test_the_default_worker_count_is_the_one_that_ran(tmp_path, monkeypatch):
    """The table and the JSON line said os.cpu_count() workers for the default, while
    capsmed runs one per CPU up to 8: 16 on a 16-core machine, where 8 ran."""
    raw = tmp_path / "raw"
    write_diaretdb1(raw, images=4, size=(500, 384), seed=0, disable_progress=True)
    real = default_workers(0)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)  # this process only, not the child
    r = bench.measure("diaretdb1", raw, tmp_path / "out.h5", 0, False)
    assert r["workers"] == real and r["preprocess_s"] > 0 and r["cpu_s"] > 0
    assert bench.measure("diaretdb1", raw, tmp_path / "out.h5", 1, False)["workers"] == 1
