"""Bad input through the real CLI: one-line error naming the file, exit 1, no output."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from capsmed.cli import app
from tests.helpers import assert_clean_failure

runner = CliRunner()


def _copy_raw(tiny_raw, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(tiny_raw, raw)
    return raw


def _preprocess(raw, out):
    return runner.invoke(app, ["-q", "preprocess", "tupac16", str(raw), "-o", str(out),
                               "--workers", "1"])




def _truncate_tiff(raw):
    victim = sorted(raw.rglob("*.tif"))[3]
    victim.write_bytes(victim.read_bytes()[:200])  # a truncated download
    return victim


def _csv_row_outside(raw):
    csv = sorted(raw.rglob("*.csv"))[0]
    csv.write_text(csv.read_text() + "9999,12\n")
    return csv


def _csv_with_header(raw):
    csv = sorted(raw.rglob("*.csv"))[0]
    csv.write_text("row,col\n10,10\n")
    return csv


@pytest.mark.parametrize("corrupt, message", [
    (_truncate_tiff, "cannot read TIFF"),
    (_csv_row_outside, "outside the 256x256 image"),
    (_csv_with_header, "line 1: expected 'row,col' integers"),
], ids=["corrupt-tiff", "csv-row-outside-image", "csv-header-line"])
def test_corrupt_raw_files(tiny_raw, tmp_path, corrupt, message):
    raw = _copy_raw(tiny_raw, tmp_path)
    victim = corrupt(raw)
    out = tmp_path / "out.h5"
    result = _preprocess(raw, out)
    assert_clean_failure(result, str(victim), out)
    assert message in result.stderr


@pytest.mark.parametrize("make", [lambda p: None, lambda p: p.mkdir()])
def test_missing_or_empty_folder(tmp_path, make):
    raw = tmp_path / "nothing"
    make(raw)
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["preprocess", "tupac16", str(raw), "-o", str(out)])
    assert_clean_failure(result, str(raw), out)


def test_train_on_a_file_that_is_not_hdf5(tmp_path):
    fake = tmp_path / "data.h5"
    fake.write_text("this is a CSV, not HDF5\n")
    run = tmp_path / "run"
    result = runner.invoke(app, ["train", "--data", str(fake), "--arch", "lenet",
                                 "--out", str(run)])
    assert_clean_failure(result, str(fake), run)
    assert "not an HDF5 file" in result.stderr


def test_train_config_that_is_a_binary_file(tmp_path):
    """--config given the dataset .h5 instead of a YAML failed with a UnicodeDecodeError
    traceback (the YAML reader caught only OS and YAML errors)."""
    fake = tmp_path / "shapes.h5"
    fake.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)))
    run = tmp_path / "run"
    result = runner.invoke(app, ["-q", "train", "--config", str(fake), "--data", str(fake),
                                 "--arch", "lenet", "--out", str(run)])
    assert_clean_failure(result, f"{fake}: not a YAML config (not UTF-8 text)", run)


def test_train_unknown_arch_and_evaluate_missing_run(tiny_h5, tmp_path):
    run = tmp_path / "run"
    result = runner.invoke(app, ["train", "--data", str(tiny_h5), "--arch", "alexnet",
                                 "--out", str(run)])
    assert result.exit_code == 1 and "unknown architecture 'alexnet'" in result.stderr
    result = runner.invoke(app, ["evaluate", str(tmp_path / "no-run")])
    assert result.exit_code == 1 and "no such run directory" in result.stderr


def test_synth_refuses_non_empty_folder(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["synth", "tupac16", str(tmp_path), "--cases", "1"])
    assert result.exit_code == 1 and "not empty" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_data_info_on_a_file_that_is_not_hdf5(tmp_path):
    fake = tmp_path / "notes.h5"
    fake.write_text("hello")
    result = runner.invoke(app, ["data", "info", str(fake)])
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {fake}: not an HDF5 file (expected a dataset " \
                                    "written by `capsmed preprocess`)"
