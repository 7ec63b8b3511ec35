"""The HDF5 dataset contract: round trip, leak refusal, atomic writes, schema errors."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from capsmed.data.contract import (
    DatasetWriter,
    class_counts,
    find_leaks,
    groups_by_split,
    load_split,
    read_info,
)
from capsmed.data.schema import DATA_REVISION
from capsmed.errors import CapsmedError


def _write(path, splits, allow=False):
    with DatasetWriter(path, dataset="toy", kind="folder", domain="generic",
                       class_names=["neg", "pos"], image_shape=(1, 4, 4),
                       preprocessing={"patch": 100, "nested": {"a": [1, 2]}},
                       source={"raw_dir": "/raw"}, allow_group_leak=allow) as w:
        for split, (labels, groups) in splits.items():
            n = len(labels)
            images = np.arange(n * 16, dtype=np.uint8).reshape(n, 1, 4, 4)
            w.append(split, images, labels, groups, meta={"row": np.arange(n, dtype=np.int32),
                                                          "source": np.array(["f"] * n)})
    return path


def test_round_trip_keeps_everything(tmp_path):
    path = _write(tmp_path / "d.h5", {"train": ([0, 1, 1], ["a", "a", "b"]),
                                      "test": ([1, 0], ["c", "c"])})
    info = read_info(path)
    assert info.dataset == "toy" and info.class_names == ("neg", "pos")
    assert info.image_size == (4, 4) and info.channels == 1
    assert info.preprocessing == {"patch": 100, "nested": {"a": [1, 2]}}
    assert info.split_sizes == {"test": 2, "train": 3}
    split = load_split(path, "train", with_meta=True)
    assert split.images.dtype == np.uint8 and split.images.shape == (3, 1, 4, 4)
    assert split.images[2, 0, 0, 0] == 32
    assert split.labels.tolist() == [0, 1, 1] and split.groups.tolist() == ["a", "a", "b"]
    assert split.meta["row"].tolist() == [0, 1, 2]
    assert list(split.meta["source"]) == ["f", "f", "f"]
    assert class_counts(path)["train"].tolist() == [1, 2]
    assert groups_by_split(path) == {"train": {"a", "b"}, "test": {"c"}}
    with h5py.File(path) as f:
        assert f["train/images"].chunks is not None
        assert json.loads(f.attrs["class_names"]) == ["neg", "pos"]
        assert f.attrs["created"].endswith("+00:00")
        assert int(f.attrs["data_revision"]) == DATA_REVISION >= 1


def test_group_in_two_splits_is_refused_and_nothing_written(tmp_path):
    target = tmp_path / "leak.h5"
    with pytest.raises(CapsmedError, match="a in test\\+train"):
        _write(target, {"train": ([0, 1], ["a", "b"]), "test": ([1], ["a"])})
    assert list(tmp_path.iterdir()) == []


def test_leak_can_be_allowed_explicitly_and_is_recorded(tmp_path):
    path = _write(tmp_path / "leak.h5", {"train": ([0], ["a"]), "val": ([1], ["a"])},
                  allow=True)
    with h5py.File(path) as f:
        assert bool(f.attrs["group_leak_allowed"]) is True


def test_error_inside_block_leaves_no_file(tmp_path):
    target = tmp_path / "partial.h5"
    with pytest.raises(RuntimeError), DatasetWriter(
            target, dataset="toy", kind="folder", domain="generic",
            class_names=["a"], image_shape=(1, 2, 2),
            preprocessing={}, source={}) as w:
        w.append("train", np.zeros((1, 1, 2, 2), np.uint8), [0], ["g"])
        raise RuntimeError("crash mid-write")
    assert list(tmp_path.iterdir()) == []


def test_bad_batches_are_rejected(tmp_path):
    with pytest.raises(CapsmedError, match="expected uint8"), DatasetWriter(
            tmp_path / "x.h5", dataset="t", kind="folder", domain="generic",
            class_names=["a", "b"], image_shape=(1, 2, 2),
            preprocessing={}, source={}) as w:
        w.append("train", np.zeros((1, 1, 3, 3), np.uint8), [0], ["g"])
    with pytest.raises(CapsmedError, match="label out of range"), DatasetWriter(
            tmp_path / "y.h5", dataset="t", kind="folder", domain="generic",
            class_names=["a", "b"], image_shape=(1, 2, 2),
            preprocessing={}, source={}) as w:
        w.append("train", np.zeros((1, 1, 2, 2), np.uint8), [2], ["g"])
    assert list(tmp_path.iterdir()) == []


def test_find_leaks():
    assert find_leaks({"train": {"a", "b"}, "val": {"c"}}) == {}
    assert find_leaks({"train": {"a"}, "val": {"a"}, "test": {"a", "d"}}) == {
        "a": ["test", "train", "val"]}


@pytest.mark.parametrize("make, message", [
    (lambda p: None, "no such file"),
    (lambda p: p.write_text("not hdf5"), "not an HDF5 file"),
    (lambda p: h5py.File(p, "w").close(), "not a capsmed dataset"),
])
def test_unreadable_files_name_the_file(tmp_path, make, message):
    path = tmp_path / "bad.h5"
    make(path)
    with pytest.raises(CapsmedError, match=message) as err:
        read_info(path)
    assert str(path) in str(err.value)


def test_missing_split_is_reported(tmp_path):
    path = _write(tmp_path / "d.h5", {"train": ([0], ["a"])})
    with pytest.raises(CapsmedError, match="has no 'val' split"):
        load_split(path, "val")


def _write_folds(path, folds, groups, allow=False):
    n = len(folds)
    with DatasetWriter(path, dataset="toy", kind="folder", domain="generic",
                       class_names=["neg", "pos"], image_shape=(1, 4, 4),
                       preprocessing={}, source={}, allow_group_leak=allow) as w:
        half = n // 2  # two batches, to exercise appending folds
        for sl in (slice(0, half), slice(half, n)):
            k = len(folds[sl])
            w.append("all", np.zeros((k, 1, 4, 4), np.uint8), np.arange(k) % 2, groups[sl],
                     meta={"pair": np.ones((k, 2, 3), np.uint8)}, folds=np.asarray(folds[sl]))
    return path


def test_folds_and_nd_meta_round_trip(tmp_path):
    path = _write_folds(tmp_path / "f.h5", [0, 1, 2, 0, 1, 2], list("abcdef"))
    info = read_info(path)
    assert info.folds == {"all": 3} and info.split_sizes == {"all": 6}
    split = load_split(path, "all", with_meta=True)
    assert split.folds.dtype == np.int8 and split.folds.tolist() == [0, 1, 2, 0, 1, 2]
    assert split.meta["pair"].shape == (6, 2, 3)


def test_group_spanning_two_folds_is_refused(tmp_path):
    with pytest.raises(CapsmedError, match="span two folds"):
        _write_folds(tmp_path / "f.h5", [0, 1, 0, 1], ["a", "a", "b", "c"])
    assert not (tmp_path / "f.h5").exists()
    _write_folds(tmp_path / "f.h5", [0, 1, 0, 1], ["a", "a", "b", "c"], allow=True)
    with h5py.File(tmp_path / "f.h5") as f:
        assert bool(f.attrs["group_leak_allowed"])


def test_folds_on_some_batches_only_are_rejected(tmp_path):
    with pytest.raises(CapsmedError, match="folds given for some"), \
            DatasetWriter(tmp_path / "f.h5", dataset="t", kind="folder", domain="generic",
                          class_names=["a"],
                          image_shape=(1, 2, 2), preprocessing={}, source={}) as w:
        w.append("all", np.zeros((1, 1, 2, 2), np.uint8), [0], ["g"], folds=np.array([0]))
        w.append("all", np.zeros((1, 1, 2, 2), np.uint8), [0], ["h"])


def test_data_info_shows_folds(tmp_path):
    from rich.console import Console

    from capsmed.data.describe import describe_dataset

    path = _write_folds(tmp_path / "f.h5", [0, 1, 2, 0, 1, 2], list("abcdef"))
    console = Console(record=True, width=120)
    console.print(describe_dataset(path))
    text = console.export_text()
    assert "CV folds of 'all'" in text and "fold" in text


def test_data_info_reads_whole_at_80_columns_with_15_classes(tmp_path, monkeypatch):
    """One column per class cut every AML class name to '…' at 80 columns; the wide
    tables are turned on their side there (classes as rows)."""
    from typer.testing import CliRunner

    from capsmed.cli import app

    names = ["BAS", "EBO", "EOS", "KSC", "LYA", "LYT", "MMZ", "MOB", "MON", "MYB", "MYO",
             "NGB", "NGS", "PMB", "PMO"]
    path = tmp_path / "aml.h5"
    n = 90
    with DatasetWriter(path, dataset="aml", kind="aml", domain="cytology",
                       class_names=names, image_shape=(3, 4, 4),
                       preprocessing={}, source={}) as w:
        w.append("all", np.zeros((n, 3, 4, 4), np.uint8), np.arange(n) % 15,
                 [f"p{i // 3}" for i in range(n)], folds=np.array([(i // 3) % 5
                                                                    for i in range(n)]))
    monkeypatch.chdir(tmp_path)  # a short path: the file's name is shown whole too
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["data", "info", "aml.h5"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.output
    for name in names:  # a row of the split table and one of the fold table
        assert sum(line.split()[:2] == ["│", name] for line in lines) == 2, name


@pytest.mark.parametrize("files, shown", [
    ({"a.tif": 10, "b.tif": 5}, "(2 files, 15 bytes)"),
    ({"a.tif": "sha256:ab12"}, "(1 files)"),  # hashes (SPEC: "file hashes or sizes")
    (["a.tif", "b.tif", "c.tif"], "(3 files)"),
])
def test_data_info_shows_a_source_recorded_by_hashes_or_names(tmp_path, files, shown):
    """A portable file's source may list its raw files by hash or by name: data info
    summed them as sizes and stopped with a TypeError."""
    from rich.console import Console

    from capsmed.data.describe import describe_dataset

    path = _write(tmp_path / "d.h5", {"train": ([0, 1], ["a", "b"])})
    with h5py.File(path, "r+") as f:
        f.attrs["source"] = json.dumps({"raw_dir": "/raw", "files": files})
    console = Console(record=True, width=120)
    console.print(describe_dataset(path))
    assert f"source: /raw {shown}" in " ".join(console.export_text().split())


@pytest.mark.parametrize("revision", [None, 1])
def test_a_file_of_an_older_data_revision_is_named_by_data_info_and_training(
        tiny_h5, tmp_path, caplog, revision):
    """A file from a capsmed whose preprocessing made other images of some raw files
    (DATA_REVISION) trained without a word, and data info did not show its revision."""
    import logging
    import shutil

    from rich.console import Console

    from capsmed.data.contract import DATA_REVISION
    from capsmed.data.describe import describe_dataset
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train

    console = Console(record=True, width=120)
    console.print(describe_dataset(tiny_h5))
    assert f"data revision {DATA_REVISION} (this capsmed's)" in \
        " ".join(console.export_text().split())
    old = tmp_path / "old.h5"
    shutil.copy(tiny_h5, old)
    with h5py.File(old, "r+") as f:
        if revision is None:  # written before revisions were recorded
            del f.attrs["data_revision"]
        else:
            f.attrs["data_revision"] = revision
    console = Console(record=True, width=120)
    console.print(describe_dataset(old))
    shown = "none recorded" if revision is None else str(revision)
    text = " ".join(console.export_text().split())
    assert f"data revision {shown}" in text and f"this capsmed's is {DATA_REVISION}" in text
    with caplog.at_level(logging.WARNING, logger="capsmed"):
        train(TrainConfig(data=str(old), arch="lenet", epochs=1, batch_size=16,
                          out=str(tmp_path / "run"), model_kwargs={"widths": [3, 4],
                                                                    "hidden": [8]}),
              disable_progress=True)
    (warning,) = [m for m in caplog.messages if "data revision" in m]
    assert f"{old}: written by capsmed's data revision {revision or 0}" in warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="capsmed"):
        train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                          out=str(tmp_path / "current"), model_kwargs={"widths": [3, 4],
                                                                        "hidden": [8]}),
              disable_progress=True)
    assert not [m for m in caplog.messages if "data revision" in m]


def test_data_info_does_not_vouch_for_patients_of_a_per_image_file(tmp_path):
    """MedMNIST, MNIST or a folder set without patient ids: every image is its own
    group, so 'ok: no group in two splits' said nothing, yet read as a passed check."""
    from rich.console import Console

    from capsmed.data.describe import describe_dataset

    def text(path):
        console = Console(record=True, width=200)
        console.print(describe_dataset(path))
        return " ".join(console.export_text().split())

    per_image = _write(tmp_path / "p.h5", {"train": ([0, 1], ["a", "b"]),
                                           "test": ([0, 1], ["c", "d"])})
    assert "not checked: every image is its own group" in text(per_image)
    patients = _write(tmp_path / "g.h5", {"train": ([0, 1], ["a", "a"]),
                                          "test": ([0, 1], ["c", "c"])})
    assert "ok: no group in two splits" in text(patients)
