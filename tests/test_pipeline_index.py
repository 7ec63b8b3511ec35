"""The study index: what a study report reads instead of every run's files, the same
as reading them, read again when they change, and the stale-report refusal kept."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from capsmed.evaluate.aggregate import load_evaluated_run
from capsmed.pipeline import index as index_module
from capsmed.pipeline.index import StudyIndex
from tests.faults.common import invoke, lenet_args


def _same(a, b) -> bool:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if not np.array_equal(x, y):
                return False
        elif json.dumps(x, sort_keys=True, default=str) != json.dumps(y, sort_keys=True,
                                                                      default=str):
            return False
    return True


def test_the_study_index_holds_what_the_files_say(tiny_h5, tmp_path, monkeypatch):
    run = tmp_path / "run"
    assert invoke(lenet_args(tiny_h5, run)).exit_code == 0
    assert invoke(["evaluate", run, "--no-grids"]).exit_code == 0
    records = tmp_path / "records"
    first = StudyIndex(records)
    fresh = first.evaluated(run)
    assert _same(fresh, load_evaluated_run(run)) and first.stale(run) is None
    first.save()
    reads = []
    monkeypatch.setattr(index_module, "load_evaluated_run",
                        lambda *a: reads.append(a) or load_evaluated_run(*a))
    again = StudyIndex(records)  # as the next process reads it
    assert _same(again.evaluated(run), fresh) and reads == []
    report = run / "report" / "report.json"
    data = json.loads(report.read_text())
    data["accuracy"] = 0.123456
    report.write_text(json.dumps(data))
    os.utime(report, ns=(1, 1))  # whatever the clock: the stat differs
    assert StudyIndex(records).evaluated(run).metrics["accuracy"] == 0.123456
    assert len(reads) == 1


def test_a_report_older_than_the_kept_checkpoint_is_stale(tiny_h5, tmp_path):
    run = tmp_path / "run"
    assert invoke(lenet_args(tiny_h5, run)).exit_code == 0
    assert invoke(["evaluate", run, "--no-grids"]).exit_code == 0
    best = json.loads((run / "checkpoint.json").read_text())["epoch"]
    report = run / "report" / "report.json"
    data = json.loads(report.read_text())
    data["checkpoint_epoch"] = best + 5  # it scored another checkpoint than the kept one
    report.write_text(json.dumps(data))
    index = StudyIndex(tmp_path / "records")
    index.evaluated(run)
    assert f"scored the epoch {best + 5} checkpoint, but the run now keeps epoch {best}" \
        in index.stale(run)
