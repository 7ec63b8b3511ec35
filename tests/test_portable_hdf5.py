"""Dataset files any HDF5 reader can open: gzip (a filter built into every HDF5
library) instead of h5py's own LZF, attributes saying what each dataset holds, and a
provenance record. Files written with LZF before are still read."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from capsmed.data import writer as writer_module
from capsmed.data.contract import DatasetWriter, load_split, read_info
from capsmed.data.writer import command_line, library_versions

# HDF5's built-in filters: deflate (gzip) 1, shuffle 2, fletcher32 3
BUILT_IN = {h5py.h5z.FILTER_DEFLATE, h5py.h5z.FILTER_SHUFFLE, h5py.h5z.FILTER_FLETCHER32}


def _write(path: Path) -> Path:
    """A small file with every kind of dataset: images, labels, groups, folds, 1-D and
    N-D meta."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (30, 3, 12, 12), dtype=np.uint8)
    with DatasetWriter(path, dataset="toy", kind="folder", domain="generic",
                       class_names=["a", "b", "c"], image_shape=(3, 12, 12),
                       preprocessing={"size": 12}, source={"raw_dir": "/nowhere"}) as w:
        w.append("all", images, np.arange(30) % 3, [f"p{i // 3}" for i in range(30)],
                 meta={"source": np.array([f"f{i}.png" for i in range(30)]),
                       "row": np.arange(30, dtype=np.int32),
                       "mask": images[:, :1].copy(), "shift": rng.integers(-4, 4, (30, 2))},
                 folds=np.arange(30) // 3 % 5)
    return path


def _datasets(path: Path) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}

    def visit(name: str, obj: object) -> None:  # a value returned would stop the visit
        if isinstance(obj, h5py.Dataset):
            found[name] = obj[...]

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return found


def _filters(path: Path) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}

    def visit(name: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset):
            plist = obj.id.get_create_plist()
            out[name] = {plist.get_filter(i)[0] for i in range(plist.get_nfilters())}

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def test_every_dataset_uses_only_filters_every_hdf5_library_has(tmp_path):
    filters = _filters(_write(tmp_path / "d.h5"))
    assert set(filters) >= {"all/images", "all/labels", "all/groups", "all/folds",
                            "all/meta/mask", "all/meta/shift", "all/meta/source"}
    assert all(ids <= BUILT_IN for ids in filters.values()), filters
    assert h5py.h5z.FILTER_DEFLATE in filters["all/images"]
    assert h5py.h5z.FILTER_DEFLATE in filters["all/meta/mask"]


def test_a_file_written_with_lzf_before_is_still_read(tmp_path, monkeypatch):
    new = load_split(_write(tmp_path / "new.h5"), "all", with_meta=True)
    monkeypatch.setattr(writer_module, "COMPRESSION", {"compression": "lzf"})
    path = _write(tmp_path / "old.h5")
    assert h5py.h5z.FILTER_LZF in _filters(path)["all/images"]  # the old, h5py-only filter
    old = load_split(path, "all", with_meta=True)
    assert np.array_equal(old.images, new.images)
    assert np.array_equal(old.meta["mask"], new.meta["mask"])
    assert read_info(path).split_sizes == {"all": 30}


def test_datasets_say_what_they_hold_and_the_file_how_it_was_made(tmp_path):
    path = _write(tmp_path / "d.h5")
    with h5py.File(path, "r") as f:
        images = f["all/images"]
        assert images.attrs["axes"] == "N,C,H,W"
        assert list(images.attrs["value_range"]) == [0, 255]
        assert json.loads(f["all/labels"].attrs["class_names"]) == ["a", "b", "c"]
        assert f["all/meta/mask"].attrs["axes"] == "N,C,H,W"
        assert f["all/meta/row"].attrs["axes"] == "N"
        assert "no group" in f["all/groups"].attrs["description"]
    record = read_info(path).provenance
    assert record["command_line"] and record["platform"]
    versions = record["versions"]
    assert {"capsmed", "numpy", "h5py", "hdf5", "scikit-image", "tifffile",
            "python"} <= set(versions)
    assert versions["h5py"] == h5py.__version__ and versions["numpy"] == np.__version__


def test_the_command_line_reads_as_typed():
    assert command_line(["/venv/bin/capsmed", "preprocess", "folder", "my data", "-o",
                         "x.h5"]) == "capsmed preprocess folder 'my data' -o x.h5"
    assert command_line(["/src/capsmed/__main__.py", "synth", "mnist"]) == \
        "capsmed synth mnist"
    assert command_line(["script.py", "--flag"]) == "script.py --flag"


def test_library_versions_leave_out_what_is_not_installed(monkeypatch):
    monkeypatch.setattr(writer_module, "LIBRARIES", ("numpy", "no-such-distribution"))
    assert set(library_versions()) == {"numpy", "hdf5", "python"}


@pytest.mark.skipif(shutil.which("h5dump") is None,
                    reason="h5dump not installed (Debian: apt-get install hdf5-tools)")
def test_h5dump_dumps_every_dataset_as_h5py_reads_it(tmp_path):
    path = _write(tmp_path / "d.h5")
    datasets = _datasets(path)
    assert len(datasets) == 8
    for name, values in datasets.items():
        out = tmp_path / "dump.bin"
        result = subprocess.run(["h5dump", "-d", f"/{name}", "-b", "LE", "-o", str(out),
                                 str(path)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, (name, result.stderr)
        if values.dtype.kind == "O":  # strings: h5dump prints them
            text = subprocess.run(["h5dump", "-d", f"/{name}", str(path)],
                                  capture_output=True, text=True, timeout=60).stdout
            assert all(v.decode() in text for v in values), name
        else:
            little = values.astype(values.dtype.newbyteorder("<"))
            assert out.read_bytes() == little.tobytes(), name


def test_fixed_length_string_attributes_written_elsewhere_read_as_text(tmp_path):
    """C, MATLAB and h5py's ``np.bytes_`` write fixed-length strings, which h5py reads
    back as bytes: every text attribute is decoded, none becomes ``"b'...'"``."""
    path = tmp_path / "elsewhere.h5"
    with h5py.File(path, "w") as f:
        grp = f.create_group("train")
        grp["images"] = np.zeros((4, 1, 8, 8), np.uint8)
        grp["labels"] = np.array([0, 1, 0, 1], ">i4")  # big-endian int32
        grp["groups"] = np.array([b"p0", b"p1", b"p2", b"p3"], "S2")
        for name, value in (("dataset", "elsewhere"), ("class_names", '["a", "b"]'),
                            ("image_size", "[8, 8]"), ("capsmed_version", "0.9"),
                            ("created", "2026-01-01T00:00:00+00:00")):
            f.attrs[name] = np.bytes_(value.encode())
        f.attrs["format_version"], f.attrs["channels"] = np.int32(1), np.uint8(1)
    info = read_info(path)
    assert (info.dataset, info.class_names, info.image_size, info.channels) == \
        ("elsewhere", ("a", "b"), (8, 8), 1)
    assert (info.capsmed_version, info.created) == ("0.9", "2026-01-01T00:00:00+00:00")
    data = load_split(path, "train")
    assert data.labels.tolist() == [0, 1, 0, 1] and data.groups.tolist()[0] == "p0"
