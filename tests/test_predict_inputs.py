"""What ``capsmed predict`` reads and where it writes: input names, duplicates, given
centres, the output folder, the terminal table (no model needed)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from capsmed.errors import CapsmedError
from capsmed.predict.inputs import check_out_dir, gather_inputs, match_centres, read_centres


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_output_names_are_unique_even_against_a_suffixed_name(tmp_path):
    for name in ("a.tif", "a.png", "a-2.tif", "A.bmp"):
        touch(tmp_path / "d" / name)
    stems = [i.stem for i in gather_inputs([tmp_path / "d"], slides=False)]
    assert len({s.casefold() for s in stems}) == 4, stems  # unique, even on a case-blind disk
    assert stems[:2] == ["d_A", "d_a-2"]


def test_a_suffixed_output_name_is_never_another_inputs_own_name(tmp_path):
    """x.png, x.jpg, x-2.png given in that order: x.jpg's heatmap was d_x-2, the name
    of x-2.png's, which got d_x-2-2."""
    paths = [touch(tmp_path / "d" / name) for name in ("x.png", "x.jpg", "x-2.png")]
    items = gather_inputs(paths, slides=False)
    assert [i.stem for i in items] == ["d_x", "d_x-3", "d_x-2"]


def test_the_same_file_reached_twice_is_predicted_once(tmp_path, caplog):
    image = touch(tmp_path / "a" / "01.tif")
    (tmp_path / "b").mkdir()
    os.symlink(image, tmp_path / "b" / "linked.tif")
    items = gather_inputs([tmp_path / "a", tmp_path / "b", tmp_path / "a/../a/01.tif"],
                          slides=False)
    assert [i.path for i in items] == [image]
    assert "2 input(s) name a file already given" in caplog.text


def centres_of(*keys: str) -> dict[str, np.ndarray]:
    return {k: np.array([[10, 10]]) for k in keys}


def test_centres_must_name_each_input_once_and_unambiguously(tmp_path):
    first, second = touch(tmp_path / "01" / "01.tif"), touch(tmp_path / "02" / "01.tif")
    items = gather_inputs([tmp_path], slides=False)
    csv = tmp_path / "c.csv"
    with pytest.raises(CapsmedError, match=r"'01.tif' is ambiguous: it names 2 inputs"):
        match_centres(centres_of("01.tif"), items, csv)
    with pytest.raises(CapsmedError, match=f"names no centres for input {second}"):
        match_centres(centres_of(str(first)), items, csv)
    with pytest.raises(CapsmedError, match="both name"):
        match_centres(centres_of(str(first), f"{tmp_path}/01/./01.tif", str(second)), items,
                      csv)
    with pytest.raises(CapsmedError, match="names input.s. not given: other.tif"):
        match_centres(centres_of("other.tif"), items, csv)
    given = match_centres(centres_of(str(first), f"{tmp_path}/02/../02/01.tif"), items, csv)
    assert sorted(given) == [str(first), str(second)]


def test_a_repeated_centre_row_is_refused(tmp_path):
    csv = tmp_path / "c.csv"
    csv.write_text("input,x,y\na.tif,1,2\na.tif,3,4\na.tif,1,2\n")
    with pytest.raises(CapsmedError, match="line 4: the same window as line 2"):
        read_centres(csv)


@pytest.mark.parametrize("out, text", [
    ("in", "is (or lies inside) the input folder"),
    ("in/pred", "is (or lies inside) the input folder"),
    (".", "contains"),
    ("run/..", "contains"),
])
def test_an_output_folder_among_the_inputs_is_refused(tmp_path, out, text):
    touch(tmp_path / "in" / "01.tif")
    touch(tmp_path / "run" / "checkpoint.json")
    items = gather_inputs([tmp_path / "in"], slides=False)
    with pytest.raises(CapsmedError, match=text.replace("(", r"\(").replace(")", r"\)")):
        check_out_dir(tmp_path / out, [tmp_path / "in"], items, [tmp_path / "run"], True)


def test_overwrite_does_not_replace_a_folder_of_the_run(tmp_path):
    image = touch(tmp_path / "01.tif")
    items = gather_inputs([image], slides=False)
    run = tmp_path / "run"
    touch(run / "report" / "index.html")
    with pytest.raises(CapsmedError, match="a folder of the run"):
        check_out_dir(run / "report", [image], items, [run], overwrite=True)
    check_out_dir(run / "report", [image], items, [run], overwrite=False)  # refused later
    touch(run / "pred" / "summary.json")
    touch(run / "pred" / "predictions.csv")
    check_out_dir(run / "pred", [image], items, [run], overwrite=True)  # an earlier output
    check_out_dir(tmp_path / "out", [image], items, [run], overwrite=True)


def test_the_table_takes_absolute_and_relative_inputs(tmp_path, monkeypatch):
    from rich.console import Console

    from capsmed.predict.engine import Prediction
    from capsmed.predict.outputs import InputResult
    from capsmed.predict.report import summary_table
    from capsmed.tables.terminal import print_tables

    monkeypatch.chdir(tmp_path)
    names = ["a/01.tif", str(tmp_path / "b" / "02.tif")]
    results = [InputResult(n, (8, 8), np.array([4]), np.array([4]), 8.0,
                           np.array([[0.2, 0.8]])) for n in names]
    done = Prediction(tmp_path, results, [], "mitosis", 0.5, {"normal": 0, "mitosis": 2},
                      per_input=[{"input": n, "windows": 1} for n in names])
    console = Console(width=80, record=True)
    print_tables([summary_table(done)], console)
    text = console.export_text()
    assert "a/01.tif" in text and "b/02.tif" in text


def test_the_table_shortens_long_input_names_at_80_columns_never_splits_them(tmp_path):
    """Issue 23 (80 columns): predict's table folded an input's name over two lines,
    and its 'inputs under' caption split the folder's path mid-word."""
    from rich.console import Console

    from capsmed.predict.engine import Prediction
    from capsmed.predict.outputs import InputResult
    from capsmed.predict.report import summary_table
    from capsmed.tables.terminal import print_tables

    root = tmp_path / "slides"
    names = [str(root / f"case-{i:04d}-haematoxylin-eosin-scan-with-a-long-name-{i:06d}.tif")
             for i in range(3)]
    results = [InputResult(n, (8, 8), np.array([4]), np.array([4]), 8.0,
                           np.array([[0.2, 0.8]])) for n in names]
    done = Prediction(tmp_path, results, [], "mitosis", 0.5, {"normal": 0, "mitosis": 3},
                      per_input=[{"input": n, "windows": 1, "positives": 1} for n in names])
    console = Console(width=80, record=True)
    print_tables([summary_table(done)], console)
    lines = console.export_text().splitlines()
    assert max(map(len, lines)) <= 80
    rows = [line for line in lines if line.startswith("case-")]
    assert len(rows) == 3  # one line per input, none folded onto a second
    for i, row in enumerate(rows):
        shown = row.split()[0]
        assert "…" in shown and shown.endswith(f"-{i:06d}.tif"), row
        assert all(piece in os.path.basename(names[i]) for piece in shown.split("…"))
    assert f"{root}/" in lines  # the shared folder on a line of its own, whole


@pytest.mark.parametrize("name", ["c.webp", "scan.GIF", "s.svs"])
def test_an_image_in_a_format_predict_skips_is_refused_not_left_out(tmp_path, name):
    touch(tmp_path / "d" / "a.png")
    touch(tmp_path / "d" / "sub" / name)
    touch(tmp_path / "d" / "notes.txt")  # not an image: passed over
    with pytest.raises(CapsmedError, match=f"{name}: a .* file, a format this run does not "
                       "read from folders .* it would be left out"):
        gather_inputs([tmp_path / "d"], slides=False)
    if name == "s.svs":  # a run that reads slides takes it
        assert len(gather_inputs([tmp_path / "d"], slides=True)) == 2


def test_the_table_names_no_top_class_when_no_window_was_scored(tmp_path):
    """Slides without tissue give no windows: the 'all inputs' row listed the first
    class as the most predicted one, though no window was predicted at all."""
    from capsmed.predict.engine import Prediction
    from capsmed.predict.outputs import InputResult
    from capsmed.predict.report import summary_table

    empty = np.empty(0, np.int64)
    results = [InputResult(str(tmp_path / f"{i}.svs"), (64, 64), empty, empty, 8.0,
                           np.empty((0, 2))) for i in range(2)]
    done = Prediction(tmp_path, results, [], "mitosis", 0.5, {"normal": 0, "mitosis": 0},
                      per_input=[{"input": r.name, "windows": 0, "positives": 0}
                                 for r in results])
    rows = summary_table(done).rows
    assert [row[3] for row in rows] == ["-", "-", "-"]
    assert rows[-1][:2] == ["all inputs", "0"]


def test_a_run_folder_given_as_input_is_refused(tmp_path):
    """``capsmed predict RUN RUN -o OUT`` predicted the run's curves.png and report
    figures as images and exited 0."""
    run = tmp_path / "run"
    for name in ("config.yaml", "checkpoint.json", "curves.png",
                 "report/confusion_matrix.png"):
        touch(run / name)
    with pytest.raises(CapsmedError, match=f"{run}: is a training run folder, not a folder "
                       "of images"):
        gather_inputs([run], slides=False)
    (run / "checkpoint.json").unlink()  # a folder of images that holds a config.yaml
    assert len(gather_inputs([run], slides=False)) == 2


def test_a_folder_holding_or_inside_a_run_folder_is_refused(tmp_path):
    """The refusal of a run folder given as input missed its twins: a folder of runs
    (``runs/``) or the run's ``report/`` had the curves and confusion matrices
    predicted as images, exit 0."""
    run = tmp_path / "runs" / "lenet-seed0"
    for name in ("config.yaml", "checkpoint.json", "curves.png",
                 "report/confusion_matrix.png"):
        touch(run / name)
    with pytest.raises(CapsmedError, match=f"{tmp_path / 'runs'}: holds a training run "
                       f"folder \\({run}\\), not a folder of images"):
        gather_inputs([tmp_path / "runs"], slides=False)
    with pytest.raises(CapsmedError, match=f"{run / 'report'}: lies in a training run "
                       f"folder \\({run}\\)"):
        gather_inputs([run / "report"], slides=False)
    images = tmp_path / "images"
    touch(images / "a" / "01.png")
    assert len(gather_inputs([images], slides=False)) == 1
