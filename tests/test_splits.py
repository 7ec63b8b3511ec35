"""Case-level splits: disjoint, complete, seeded; user split files."""

from __future__ import annotations

import logging

import pytest

from capsmed.data.splits import (
    assign_splits,
    read_split_files,
    split_groups,
    warn_missing_classes,
)
from capsmed.errors import CapsmedError

FRACTIONS = {"train": 0.7, "val": 0.15, "test": 0.15}


def test_every_group_lands_in_exactly_one_split():
    groups = [f"{i:02d}" for i in range(1, 74)]
    assignment = split_groups(groups, FRACTIONS, seed=1)
    assert sorted(assignment) == groups
    sizes = {s: sum(1 for v in assignment.values() if v == s) for s in FRACTIONS}
    assert sizes == {"train": 51, "val": 11, "test": 11}


def test_split_is_seeded():
    groups = [str(i) for i in range(20)]
    assert split_groups(groups, FRACTIONS, 4) == split_groups(reversed(groups), FRACTIONS, 4)
    assert split_groups(groups, FRACTIONS, 4) != split_groups(groups, FRACTIONS, 5)


def test_small_sets_still_fill_each_split():
    assignment = split_groups(["a", "b", "c"], FRACTIONS, seed=0)
    assert sorted(assignment.values()) == ["test", "train", "val"]


def test_split_files(tmp_path):
    (tmp_path / "train.txt").write_text("01\n02  # comment\n\n")
    (tmp_path / "test.txt").write_text("03\n")
    assignment, origin = read_split_files({"train": tmp_path / "train.txt",
                                           "test": tmp_path / "test.txt"})
    assert assignment == {"01": "train", "02": "train", "03": "test"}
    assert origin["03"] == tmp_path / "test.txt"
    (tmp_path / "val.txt").write_text("02\n")
    with pytest.raises(CapsmedError, match="'02' is also listed"):
        read_split_files({"train": tmp_path / "train.txt", "val": tmp_path / "val.txt"})
    with pytest.raises(CapsmedError, match="split file not found"):
        read_split_files({"train": tmp_path / "nope.txt"})


def test_an_unknown_id_is_reported_against_the_file_that_lists_it(tmp_path):
    (tmp_path / "train.txt").write_text("01\n02\n")
    (tmp_path / "test.txt").write_text("\ufeff03\n99\n")  # a BOM is not part of an id
    files = {"train": str(tmp_path / "train.txt"), "test": str(tmp_path / "test.txt")}
    with pytest.raises(CapsmedError) as err:
        assign_splits(["01", "02", "03"], files, FRACTIONS, seed=0, unit="case")
    assert str(err.value) == f"{tmp_path / 'test.txt'}: lists case(s) not in the data: 99"


def test_splits_missing_a_class_are_named(caplog):
    logger = logging.getLogger("capsmed")  # the CLI's set-up stops its propagation
    logger.addHandler(caplog.handler)
    try:
        absent = warn_missing_classes({"train": [0, 1, 2], "val": [0, 0], "test": [2]},
                                      ["a", "b", "c"])
    finally:
        logger.removeHandler(caplog.handler)
    assert absent == ["val (b, c)", "test (a, b)"]
    assert "split(s) missing a class: val (b, c); test (a, b)" in caplog.text


def test_split_files_are_parsed_as_typed_each_split_once():
    from capsmed.cli.common import parse_split_files

    # a path is not YAML: 'true' stayed a file named True, '1e3' became 1000.0
    assert parse_split_files(["train=true", "test=1e3", "val = a b.txt"]) == {
        "train": "true", "test": "1e3", "val": "a b.txt"}
    assert parse_split_files(None) is None
    for pairs, message in (
            (["train=a.txt", "train=b.txt"], "train is given twice .a.txt and b.txt."),
            (["valid=a.txt"], "unknown split valid"),
            (["train="], "expects SPLIT=FILE, got 'train='"),
            (["a.txt"], "expects SPLIT=FILE")):
        with pytest.raises(CapsmedError, match=message):
            parse_split_files(pairs)
    with pytest.raises(CapsmedError, match="--split-file replaces the split fractions"):
        parse_split_files(["test=t.txt"], {"train": 0.5, "val": 0.25, "test": 0.25})


def test_split_files_with_fractions_are_refused_through_the_cli(tiny_raw, tmp_path):
    from typer.testing import CliRunner

    from capsmed.cli import app
    from tests.helpers import assert_clean_failure

    (tmp_path / "a.txt").write_text("01\n")
    out = tmp_path / "out.h5"
    result = CliRunner().invoke(app, ["-q", "preprocess", "tupac16", str(tiny_raw), "-o",
                                      str(out), "--split-file", f"test={tmp_path / 'a.txt'}",
                                      "--train", "0.8", "--val", "0.2", "--test", "0"])
    assert_clean_failure(result, "--split-file replaces the split fractions", out)
