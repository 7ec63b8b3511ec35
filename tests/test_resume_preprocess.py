"""Interrupted preprocessing keeps its finished files: the same command resumes and
writes the same dataset as an uninterrupted run."""

from __future__ import annotations

import numpy as np
import pytest

import capsmed.data.sources.tupac16.reader as tupac16
import capsmed.data.sources.wsi.reader as wsi
from capsmed.data.contract import load_split, read_info
from capsmed.data.resume import ResultCache
from tests.test_wsi import _cfg, _labels_csv, _slide


def _same_file(a, b):
    for split in read_info(a).split_sizes:
        x, y = load_split(a, split, with_meta=True), load_split(b, split, with_meta=True)
        np.testing.assert_array_equal(x.images, y.images)
        np.testing.assert_array_equal(x.labels, y.labels)
        np.testing.assert_array_equal(x.groups, y.groups)
        for name in x.meta:
            np.testing.assert_array_equal(x.meta[name], y.meta[name])


def _failing_after(module, name, monkeypatch, good):
    """Let ``good`` jobs of ``module.name`` through, then fail (as a crash would)."""
    real, calls = getattr(module, name), {"n": 0}

    def flaky(job):
        calls["n"] += 1
        if calls["n"] > good:
            raise KeyboardInterrupt
        return real(job)

    monkeypatch.setattr(module, name, flaky)
    return calls


def test_interrupted_tupac16_resumes_without_redoing_finished_images(
        tiny_raw, tiny_h5, tmp_path, monkeypatch):
    cfg = tupac16.Tupac16Config(positives_per_mitosis=4, workers=1, seed=0,
                                fractions={"train": 0.6, "val": 0.2, "test": 0.2})
    out = tmp_path / "t.h5"
    _failing_after(tupac16, "process_image", monkeypatch, good=6)
    with pytest.raises(KeyboardInterrupt):
        tupac16.preprocess_tupac16(tiny_raw, out, cfg)
    assert not out.exists()
    caches = list(tmp_path.glob(".t.h5.cache-*"))
    assert len(caches) == 1 and len(list(caches[0].glob("*.npz"))) == 6
    monkeypatch.undo()
    calls = _failing_after(tupac16, "process_image", monkeypatch, good=10**6)
    tupac16.preprocess_tupac16(tiny_raw, out, cfg)
    assert calls["n"] == 10 - 6  # only the images the first run did not finish
    _same_file(out, tiny_h5)
    assert not list(tmp_path.glob(".t.h5.cache-*"))  # removed once the file is in place


def test_interrupted_wsi_resumes_bands_and_other_options_start_afresh(tmp_path, monkeypatch):
    for i in range(3):
        _slide(tmp_path / f"s{i}.svs", size=768, seed=i)
    csv = _labels_csv(tmp_path / "labels.csv", ["slide,label", "s0,a", "s1,b", "s2,a"])
    cfg = _cfg(slide_labels_csv=str(csv), tiles_per_job=4)
    whole = wsi.preprocess_wsi([tmp_path], tmp_path / "whole.h5", cfg)
    _failing_after(wsi, "process_band", monkeypatch, good=2)
    with pytest.raises(KeyboardInterrupt):
        wsi.preprocess_wsi([tmp_path], tmp_path / "cut.h5", cfg)
    monkeypatch.undo()
    calls = _failing_after(wsi, "process_band", monkeypatch, good=10**6)
    wsi.preprocess_wsi([tmp_path], tmp_path / "cut.h5", cfg)
    done_twice = calls["n"]
    _same_file(tmp_path / "cut.h5", whole)
    calls["n"] = 0
    wsi.preprocess_wsi([tmp_path], tmp_path / "whole2.h5", cfg)
    assert done_twice == calls["n"] - 2  # the two finished bands were not redone


def test_cache_is_keyed_by_every_parameter(tmp_path):
    a = ResultCache(tmp_path / "x.h5", {"patch": 100})
    b = ResultCache(tmp_path / "x.h5", {"patch": 101})
    assert a.dir != b.dir and a.dir == ResultCache(tmp_path / "x.h5", {"patch": 100}).dir


def test_a_changed_ground_truth_csv_is_recomputed_not_reused(tiny_raw, tmp_path,
                                                             monkeypatch):
    """Issue 12 item 1: the cache was keyed on the TIFF sizes only, so a corrected CSV
    (same size) was served from the cache with the old mitoses."""
    import shutil

    raw = tmp_path / "raw"
    shutil.copytree(tiny_raw, raw)
    cfg = tupac16.Tupac16Config(positives_per_mitosis=4, workers=1, seed=0,
                                fractions={"train": 0.6, "val": 0.2, "test": 0.2})
    _failing_after(tupac16, "process_image", monkeypatch, good=6)
    with pytest.raises(KeyboardInterrupt):
        tupac16.preprocess_tupac16(raw, tmp_path / "t.h5", cfg)
    monkeypatch.undo()
    finished = tupac16.discover(raw)[:6]
    csv = next(r.csv for r in finished if r.csv is not None and len(r.mitoses))
    rows = csv.read_text().splitlines()
    r, c = rows[0].split(",")
    rows[0] = f"{c},{r}"  # the same bytes, another mitosis
    csv.write_text("\n".join(rows) + "\n")
    calls = _failing_after(tupac16, "process_image", monkeypatch, good=10**6)
    tupac16.preprocess_tupac16(raw, tmp_path / "t.h5", cfg)
    assert calls["n"] == 4 + 1  # the unfinished images and the one whose CSV changed
    monkeypatch.undo()
    fresh = tupac16.preprocess_tupac16(raw, tmp_path / "fresh.h5", cfg)
    _same_file(tmp_path / "t.h5", fresh)


def test_changed_point_labels_are_recomputed_not_reused(tmp_path, monkeypatch):
    """The same for a slide's annotations: a band's labels depend on them."""
    for i in range(2):
        _slide(tmp_path / f"s{i}.svs", size=768, seed=i)
    rows = ["slide,x,y,label", "s0,300,300,a", "s0,550,450,b", "s1,300,300,b",
            "s1,550,450,a"]
    csv = _labels_csv(tmp_path / "points.csv", rows)
    cfg = _cfg(points_csv=str(csv), tiles_per_job=2)  # a band is one row of 6 tiles
    _failing_after(wsi, "process_band", monkeypatch, good=4)  # s0's rows with points
    with pytest.raises(KeyboardInterrupt):
        wsi.preprocess_wsi([tmp_path], tmp_path / "cut.h5", cfg)
    monkeypatch.undo()
    _labels_csv(csv, [rows[0], "s0,300,300,b", "s0,550,450,a", *rows[3:]])  # same size
    wsi.preprocess_wsi([tmp_path], tmp_path / "cut.h5", cfg)
    fresh = wsi.preprocess_wsi([tmp_path], tmp_path / "fresh.h5", cfg)
    _same_file(tmp_path / "cut.h5", fresh)


def test_cache_of_another_data_revision_is_not_reused(tmp_path, monkeypatch):
    """Results of an older capsmed's readers (upgraded between an interrupted run and
    its rerun) entered a file stamped with the new data revision."""
    from capsmed.data import schema

    before = ResultCache(tmp_path / "x.h5", {"patch": 100})
    monkeypatch.setattr(schema, "DATA_REVISION", schema.DATA_REVISION + 1)
    assert ResultCache(tmp_path / "x.h5", {"patch": 100}).dir != before.dir


def test_a_cached_result_cut_short_is_recomputed(tmp_path):
    """An entry renamed into place before a power cut wrote its blocks (empty or cut)
    stopped every rerun with a traceback instead of being recomputed."""
    import dataclasses

    @dataclasses.dataclass
    class Result:
        values: np.ndarray
        count: int

    cache = ResultCache(tmp_path / "x.h5", {})
    cache.put("job", Result(np.arange(1000), 3))
    whole = cache._path("job").read_bytes()
    for cut in (whole[:len(whole) // 2], whole[:-10], b""):
        cache._path("job").write_bytes(cut)
        assert cache.get("job", Result) is None
    cache._path("job").write_bytes(whole)
    assert cache.get("job", Result).count == 3
