"""Interrupted preprocessing keeps its finished files: the same command resumes and
writes the same dataset as an uninterrupted run."""

from __future__ import annotations

import numpy as np
import pytest

import capsmed.data.sources.tupac16 as tupac16
import capsmed.data.sources.wsi as wsi
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
