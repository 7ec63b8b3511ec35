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


def test_results_left_by_an_interrupted_run_are_not_reused_in_the_timed_run(tmp_path,
                                                                            monkeypatch):
    """A benchmark stopped mid-way left capsmed's result cache beside its output; the
    next run's preprocessing resumed from it (workers are not part of its key), so
    'preprocess s' timed only the images the cache lacked."""
    import subprocess

    import pytest

    from capsmed.data.sources.tupac16 import reader
    from capsmed.data.sources.tupac16.synth import write_tupac16

    raw, out = tmp_path / "raw", tmp_path / "tupac16-3.h5"
    write_tupac16(raw, cases=3, images_per_case=2, size=256, seed=0, disable_progress=True)
    append, calls = reader.DatasetWriter.append, []

    def stop_at_the_fourth(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("stopped")
        return append(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(reader.DatasetWriter, "append", stop_at_the_fourth)
        with pytest.raises(RuntimeError):
            reader.preprocess_tupac16(raw, out, reader.Tupac16Config(workers=1),
                                      disable_progress=True)
    assert list(tmp_path.glob(f".{out.name}.cache-*"))  # finished results kept
    cached_at_start, popen = [], subprocess.Popen

    def spy(*args, **kwargs):
        cached_at_start.append(bool(list(tmp_path.glob(f".{out.name}.cache-*"))))
        return popen(*args, **kwargs)

    monkeypatch.setattr(bench.subprocess, "Popen", spy)
    r = bench.measure("tupac16", raw, out, 1, False)
    assert cached_at_start == [False] and r["preprocess_s"] > 0 and out.is_file()
