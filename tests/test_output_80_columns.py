"""What a person reads (issue 23): a short study through the CLI in an 80-column log
(a pipe, CI) says each event once and runs no line past 80 columns (evaluate, analyze
routing and report: tests/test_evaluate_extras.py, test_analyze.py, test_report.py)."""

from __future__ import annotations

import shutil

from typer.testing import CliRunner

from capsmed.cli import app

runner = CliRunner()
TINY_LENET_ARGS = ["--model-arg", "widths=[3,4]", "--model-arg", "hidden=[8]"]


def test_a_short_study_says_each_event_once_within_80_columns(tiny_raw, tmp_path,
                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_raw, "raw")
    run = "runs/tupac16-lenet-fraction-0.5-seed0-057f80bb72f2-and-a-long-tail"
    said = []
    for args in (["preprocess", "tupac16", "raw", "-o", "data/tupac16.h5",
                  "--positives-per-mitosis", "2", "--workers", "1", "--seed", "0"],
                 ["train", "--data", "data/tupac16.h5", "--arch", "lenet", "--epochs", "2",
                  "--batch-size", "16", "--fraction", "0.5", "--out", run,
                  *TINY_LENET_ARGS],
                 ["runs", "ls", "runs"]):
        result = runner.invoke(app, args, terminal_width=80, env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output + result.stderr
        said.append(result.stdout + result.stderr)
    text = "\n".join(said)
    long = [line for line in text.splitlines() if len(line) > 80]
    assert not long, "\n".join(long)
    assert text.count("wrote data/tupac16.h5") == 1  # the writer's log, not echoed again
    for epoch in (1, 2):
        assert text.count(f"epoch {epoch}/2:") == 1  # the log line; no leftover bar
    assert "run saved to" in said[1] and "inspect it with: capsmed data info" in said[0]


def test_the_runners_notes_and_summary_wrap_at_80_columns_in_a_log(tmp_path):
    """`capsmed run` in a log printed its notes and failures on lines of 100 columns and
    more (a pipe is 80 wide); wrapped at spaces, a run's name and a path stay whole."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from capsmed.pipeline.display import RunBoard

    log = io.StringIO()
    board = RunBoard("smoke", 8, Console(file=log, width=80, force_terminal=False))
    note = ("analysis 'routing-seed0' not run: it reads 1 run(s) outside the selection "
            "(tupac16-capsnet-full-seed0, ...)")
    path = f"{tmp_path}/logs/tupac16-capsnet-full-seed0-3cb4c4622df0.log"
    with board:
        board.note(note)
        board.event("running", "tupac16-capsnet-full-seed0")
        board.event("failed", "tupac16-capsnet-full-seed0", f"training failed; see {path}")
    board.summary({"tupac16-capsnet-full-seed0": f"training failed; see {path}"}, 6.0,
                  SimpleNamespace(out=tmp_path / "[study]"))
    lines = log.getvalue().splitlines()
    assert all(len(line) <= 80 or line.strip() == path for line in lines), lines
    text = " ".join(" ".join(lines).split())
    assert note in text and text.count(f"training failed; see {path}") >= 1
    assert any(line.strip() == path or line.endswith(path) for line in lines)
    assert "smoke: 1 failed, 0 done (0.1 min). Failed:" in lines


def test_each_wrote_line_is_said_once_within_80_columns(tmp_path, monkeypatch):
    """`preprocess digits`, `synth medmnist` and `preprocess medmnist` logged "wrote X"
    and echoed it again on one line of 120 columns and more."""
    monkeypatch.chdir(tmp_path)
    folder = "a-folder-whose-name-is-long-enough-to-matter"
    said = []
    for args in (["preprocess", "digits", "-o", f"{folder}/digits-dataset.h5"],
                 ["synth", "medmnist", f"{folder}/npz", "--train", "20", "--val", "8",
                  "--test", "8"],
                 ["preprocess", "medmnist", f"{folder}/npz/bloodmnist.npz", "-o",
                  f"{folder}/bloodmnist-dataset.h5"]):
        result = runner.invoke(app, args, terminal_width=80, env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output + result.stderr
        said.append(result.stdout + result.stderr)
    text = "\n".join(said)
    long = [line for line in text.splitlines() if len(line) > 80]
    assert not long, "\n".join(long)
    words = " ".join(text.split())  # a wrapped line read as one
    for name in ("digits-dataset.h5", "npz/bloodmnist.npz", "bloodmnist-dataset.h5"):
        assert words.count(f"wrote {folder}/{name}") == 1, name
    assert words.count("inspect it with: capsmed data info") == 2
