"""Case-level splits: disjoint, complete, seeded; user split files."""

from __future__ import annotations

import pytest

from capsmed.data.splits import read_split_files, split_groups
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
    assignment = read_split_files({"train": tmp_path / "train.txt",
                                   "test": tmp_path / "test.txt"})
    assert assignment == {"01": "train", "02": "train", "03": "test"}
    (tmp_path / "val.txt").write_text("02\n")
    with pytest.raises(CapsmedError, match="'02' is also listed"):
        read_split_files({"train": tmp_path / "train.txt", "val": tmp_path / "val.txt"})
    with pytest.raises(CapsmedError, match="split file not found"):
        read_split_files({"train": tmp_path / "nope.txt"})
