"""The output of ``capsmed preprocess``: checked before the work, never clobbered, owned
while a run writes it, cleaned after a killed run; interruptions end with one line and
exit code 130; worker processes die with the main process (issue 12, items 16, 18, 19
and 21)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import capsmed.data.sources.folder.reader as folder
from capsmed.data.contract import read_info
from capsmed.data.output import claim_output
from tests.faults.common import assert_refused, invoke


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    from capsmed.data.sources.folder.synth import write_class_folders

    root = tmp_path_factory.mktemp("shapes") / "shapes"
    write_class_folders(root, classes=2, images_per_class=6, patients=3, size=32)
    return root


def _folder_args(root: Path, out: Path, *extra: object) -> list[object]:
    return ["preprocess", "folder", root, "-o", out, "--workers", "1", "--group-pattern",
            r"^(P\d+)_", *extra]


def test_an_output_that_is_a_folder_is_refused_before_any_input_is_read(tmp_path):
    out = tmp_path / "data.h5"
    out.mkdir()
    result = invoke(_folder_args(tmp_path / "no-such-root", out))
    assert_refused(result, out, text="is a folder")


def test_an_existing_output_needs_overwrite(shapes, tmp_path):
    out = tmp_path / "data.h5"
    out.write_bytes(b"a dataset some runs point to")
    result = invoke(_folder_args(shapes, out))
    assert_refused(result, out, text="already exists", unchanged={out: out.read_bytes()})
    result = invoke(_folder_args(shapes, out, "--overwrite"))
    assert result.exit_code == 0, result.output
    assert read_info(out).dataset == "shapes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.h5"]


def test_a_killed_runs_temporaries_are_removed_and_no_others(shapes, tmp_path):
    out = tmp_path / "data.h5"
    stale = tmp_path / ".data.h5.k1ll3d_9.tmp"  # what atomic_path left at kill -9
    others = [tmp_path / ".other.h5.k1ll3d_9.tmp", tmp_path / ".data.h5.k1ll3d_9.npz",
              tmp_path / "data.h5.k1ll3d_9.tmp"]
    for path in (stale, *others):
        path.write_bytes(b"x" * 1000)
    result = invoke(_folder_args(shapes, out))
    assert result.exit_code == 0, result.output
    assert not stale.exists() and all(p.exists() for p in others)
    assert not list(tmp_path.glob(".data.h5.lock"))


def test_an_output_another_run_writes_is_left_alone(shapes, tmp_path):
    out = tmp_path / "data.h5"
    with claim_output(out):  # a live run: it holds the lock and may own temporaries
        live = tmp_path / ".data.h5.l1ve_run.tmp"
        live.write_bytes(b"half a dataset")
        result = invoke(_folder_args(shapes, out))
        assert result.exit_code == 1 and "another capsmed process is writing" in \
            result.stderr, result.output
        assert live.exists()
    assert not (tmp_path / ".data.h5.lock").exists()


class _SignalInDestructor:
    """Sends SIGINT to this process from ``__del__``: Python's handler then raises
    KeyboardInterrupt inside the destructor, where it cannot propagate."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)


def test_an_interrupt_a_destructor_swallows_still_stops_the_run(shapes, tmp_path,
                                                                monkeypatch, capfd):
    real, calls = folder.process_chunk, {"n": 0}

    def chunk_then_interrupt(job):
        calls["n"] += 1
        _SignalInDestructor()  # created and dropped at once
        return real(job)

    monkeypatch.setattr(folder, "process_chunk", chunk_then_interrupt)
    # as in a terminal, even when the suite was started with SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    out = tmp_path / "data.h5"
    try:
        result = invoke(_folder_args(shapes, out))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert_refused(result, "error: interrupted", code=130, absent=[out])
    assert "Exception ignored" not in capfd.readouterr().err


# --- real processes: signals from outside, kill -9 -------------------------------------

def _alive(session: int) -> list[int]:
    """Processes of ``session`` that are not zombies (a dead child not yet reaped)."""
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == session and fields[0] != "Z":  # state, ..., session id
            alive.append(int(entry.name))
    return alive


def _wait_gone(session: int, limit: float) -> float:
    start = time.monotonic()
    while _alive(session) and time.monotonic() - start < limit:
        time.sleep(0.05)
    assert not _alive(session), f"processes left: {_alive(session)}"
    return time.monotonic() - start


@pytest.fixture(scope="module")
def tupac_raw(tmp_path_factory) -> Path:
    from capsmed.data.sources.tupac16.synth import write_tupac16

    root = tmp_path_factory.mktemp("tupac") / "raw"
    write_tupac16(root, cases=8, images_per_case=4, size=512, seed=1)
    return root


def _sigint_default() -> None:
    # A shell starts background jobs with SIGINT ignored, and children inherit that (CI
    # may run the suite so): give the run the SIGINT a terminal's Ctrl-C would reach.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(raw: Path, out: Path) -> subprocess.Popen:
    """preprocess tupac16 with 3 workers in its own session; returns once it writes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "capsmed", "-q", "preprocess", "tupac16", str(raw), "-o",
         str(out), "--workers", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True, preexec_fn=_sigint_default)
    deadline = time.monotonic() + 60
    while not list(out.parent.glob(f".{out.name}.*.tmp")) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.3)  # the workers are busy with the first images
    assert proc.poll() is None, proc.communicate()
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("send", [
    lambda p: os.kill(p.pid, signal.SIGINT),
    lambda p: os.killpg(p.pid, signal.SIGINT),  # Ctrl-C in a terminal
    lambda p: os.kill(p.pid, signal.SIGTERM),
], ids=["sigint-main", "sigint-group", "sigterm-main"])
def test_an_interrupted_run_says_so_on_one_line_and_leaves_nothing(tupac_raw, tmp_path,
                                                                   send):
    out = tmp_path / "data.h5"
    proc = _start(tupac_raw, out)
    send(proc)
    _, err = proc.communicate(timeout=60)
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert proc.returncode == 130, err.decode()
    assert len(lines) == 1 and lines[0].startswith("error: interrupted"), err.decode()
    assert not out.exists()
    assert not list(tmp_path.glob(".data.h5.*.tmp")) and not (tmp_path / ".data.h5.lock"
                                                               ).exists()
    _wait_gone(proc.pid, 5.0)


@pytest.mark.slow
def test_kill_9_takes_the_workers_along_and_the_next_run_cleans_up(tupac_raw, tmp_path):
    out = tmp_path / "data.h5"
    proc = _start(tupac_raw, out)
    assert len(_alive(proc.pid)) >= 4  # the main process and its 3 workers
    proc.kill()
    proc.communicate()
    assert _wait_gone(proc.pid, 10.0) < 5.0  # workers used to live on for 45 s or more
    assert list(tmp_path.glob(".data.h5.*.tmp"))  # what kill -9 leaves
    rerun = subprocess.run([sys.executable, "-m", "capsmed", "-q", "preprocess", "tupac16",
                            str(tupac_raw), "-o", str(out), "--workers", "3"],
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.h5"]
