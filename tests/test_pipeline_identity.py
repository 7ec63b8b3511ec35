"""A run's identity is what its training computes: adding an evaluation evaluates the
finished run, and a data file made again with the same content (other bytes, another
time) keeps every run's identity; its digest is kept for later processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from capsmed.data import digest
from capsmed.data.digest import dataset_digest, file_digest, keep_digests_in

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "pipelines" / "smoke.yaml"


def _h5(path: Path, created: str, labels=(0, 1, 1)) -> Path:
    with h5py.File(path, "w") as f:
        f.attrs["created"] = created
        f.attrs["capsmed_version"] = created
        f.attrs["class_names"] = json.dumps(["a", "b"])
        f.attrs["preprocessing"] = json.dumps({"size": 28})
        g = f.create_group("train")
        g.create_dataset("images", data=np.arange(3 * 4, dtype=np.uint8).reshape(3, 1, 2, 2),
                         chunks=True, compression="lzf")
        g.create_dataset("labels", data=np.array(labels, dtype=np.int64))
        g.create_dataset("groups", data=np.array([b"c1", b"c2", b"c3"]),
                         dtype=h5py.string_dtype())
    return path


def test_a_dataset_digest_covers_content_not_bytes_or_time(tmp_path):
    a = _h5(tmp_path / "a.h5", "2024-01-01")
    b = _h5(tmp_path / "b.h5", "2026-11-24")
    assert file_digest(a) != file_digest(b)  # the bytes differ (time, version)
    assert dataset_digest(a) == dataset_digest(b)
    c = _h5(tmp_path / "c.h5", "2024-01-01", labels=(0, 1, 0))
    assert dataset_digest(c) != dataset_digest(a)  # one label differs
    d = _h5(tmp_path / "d.h5", "2024-01-01")
    with h5py.File(d, "a") as f:
        f.attrs["preprocessing"] = json.dumps({"size": 32})
    assert dataset_digest(d) != dataset_digest(a)  # the preprocessing record differs
    e = _h5(tmp_path / "e.h5", "2024-01-01")
    with h5py.File(e, "a") as f:  # made by another command line, with other versions
        f.attrs["provenance"] = json.dumps({"command_line": "capsmed preprocess x -o e.h5",
                                            "versions": {"torch": "9.9"}})
    assert dataset_digest(e) == dataset_digest(a)


def test_a_content_digest_is_kept_for_later_processes(tmp_path, monkeypatch):
    data = _h5(tmp_path / "a.h5", "x")
    store = tmp_path / "digests.jsonl"
    keep_digests_in(store)
    try:
        first = dataset_digest(data)
        digest._content.clear()
        monkeypatch.setattr(digest, "_content_digest", lambda path: pytest.fail("read"))
        assert dataset_digest(data) == first  # from the file, no re-reading
        monkeypatch.setattr(digest, "_stored", {})  # as a new process starts
        assert dataset_digest(data) == first
        os.utime(data, ns=(time.time_ns(), time.time_ns()))  # touched: read again
        digest._content.clear()
        with pytest.raises(pytest.fail.Exception):
            dataset_digest(data)
    finally:
        keep_digests_in(None)


def test_a_file_rewritten_in_place_with_its_old_times_is_read_again(tmp_path, monkeypatch):
    """cp -p over an existing file keeps its inode, sets the old modification time and,
    for arrays of the same shapes, the same size: the stored digest of the old content
    was taken for the new one (its data stage's runs were not trained again)."""
    import shutil

    data = _h5(tmp_path / "a.h5", "x")
    other = _h5(tmp_path / "b.h5", "x", labels=(1, 1, 1))  # other content, same size
    keep_digests_in(tmp_path / "digests.jsonl")
    try:
        first = dataset_digest(data)
        before = os.stat(data)
        time.sleep(0.01)
        shutil.copyfile(other, data)  # in place: the same inode
        os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = os.stat(data)
        assert (after.st_ino, after.st_size, after.st_mtime_ns) == \
            (before.st_ino, before.st_size, before.st_mtime_ns)
        monkeypatch.setattr(digest, "_stored", {})  # a later process
        digest._content.clear()
        assert dataset_digest(data) != first
    finally:
        keep_digests_in(None)


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "capsmed", "run", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_an_added_evaluation_or_remade_data_trains_nothing_again(tmp_path):
    raw = yaml.safe_load(SMOKE.read_text())
    raw["variables"]["out"] = str(tmp_path / "out")
    raw["analyses"] = []
    raw["report"]["tables"] = raw["report"]["tables"][:1]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    select = ["--only", "arch=lenet,condition=full,seed=0"]
    first = _run(str(path), *select)
    assert first.returncode == 0, first.stdout + first.stderr
    weights = next((tmp_path / "out" / "runs").glob("*/checkpoint.safetensors"))
    made = weights.stat().st_mtime_ns
    raw["evaluate"].append({"name": "report-val", "split": "val"})
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    second = _run(str(path), *select)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (weights.parent / "report-val" / "report.json").is_file()
    data = tmp_path / "out" / "data" / "tupac16.h5"
    before = dataset_digest(data)
    data.unlink()  # made again by its stage, with the same content
    third = _run(str(path), *select)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "data stage 'tupac16'" in third.stdout and dataset_digest(data) == before
    # the run's job found its folder finished under the same identity: nothing trained
    assert weights.stat().st_mtime_ns == made and len(list(weights.parents[1].iterdir())) == 1
    log = (tmp_path / "out" / "logs" / f"{weights.parent.name}.log").read_text()
    commands = [line.split(" -m capsmed ")[1].split()[0] for line in log.splitlines()
                if line.startswith("$ ")]
    assert commands == ["train", "evaluate", "evaluate"]  # report-val added, once


def test_reporting_and_state_options_keep_a_run_s_identity(tmp_path):
    """Tracking (MLflow, W&B), how often the resume state is saved and the speed modes
    change nothing a run computes; its precision and its seed do."""
    from dataclasses import replace

    from capsmed.pipeline.identity import run_identity
    from capsmed.pipeline.spec import load_pipeline

    raw = yaml.safe_load(SMOKE.read_text())
    raw["variables"]["out"] = str(tmp_path / "out")
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    run = load_pipeline(path).runs[0]
    data = _h5(tmp_path / "d.h5", "x")
    run = replace(run, train={**run.train, "data": str(data)})
    same = {"mlflow": "file:/tmp/m", "mlflow_experiment": "x", "wandb": "offline",
            "state_every_minutes": 0.5, "cuda_graph": True, "tensorboard": True}
    for key, value in same.items():
        assert run_identity(replace(run, train={**run.train, key: value})) == \
            run_identity(run), key
    for key, value in {"precision": "bf16", "seed": 7}.items():
        assert run_identity(replace(run, train={**run.train, key: value})) != \
            run_identity(run), key
