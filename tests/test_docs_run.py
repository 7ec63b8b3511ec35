"""Every shell block of README.md and docs/*.md runs as written, in order (issue 23).

Each page runs in a fresh temporary folder of its own: its ```bash blocks one after
the other, each through ``bash`` with ``set -euo pipefail``, on the synthetic data its
own earlier blocks make. The folder starts with a copy of the repository's
``pipelines/`` and ``examples/`` (what a reader's clone has) and nothing else;
``capsmed`` and ``python`` on its PATH are this checkout's. A block marked
``<!-- docs-test: not run (REASON) -->`` is reported as a skipped test with its reason,
one per block, so none is left out silently (the convention: tests/docs_blocks.py).

The fast tests check the convention itself: every command line sits in a block this
test runs or in a synopsis, and the blocks left out are few and say why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.docs_blocks import (
    PAGES,
    ROOT,
    Block,
    indented_commands,
    misplaced_commands,
    page_name,
    read_blocks,
)

# Pages another change is rewriting; their commands are not run yet. Each is listed
# as a skipped test with this reason; remove the entry once the page follows the
# convention.
PENDING: dict[str, str] = {}
# A block that cannot run here is an exception: raising this needs a reason in review.
MAX_NOT_RUN = 6
BLOCK_TIMEOUT_S = 600
STDERR_TAIL = 25  # lines of a failing command's stderr in the failure message

_PAGES = [p for p in PAGES if page_name(p) not in PENDING]
BLOCKS = {page_name(p): read_blocks(p) for p in PAGES}
NOT_RUN = [b for p in _PAGES for b in BLOCKS[page_name(p)] if b.not_run is not None]
_PREAMBLE = ('set -euo pipefail\n'
             'trap \'echo "docs-test: exit $? from: $BASH_COMMAND" >&2\' ERR\n')


def _runnable(page: str) -> list[Block]:
    return [b for b in BLOCKS[page] if b.language == "bash" and b.not_run is None]


@pytest.mark.parametrize("page", [page_name(p) for p in _PAGES])
def test_every_command_is_in_a_block_the_test_runs_or_in_a_synopsis(page):
    for block in BLOCKS[page]:
        assert not misplaced_commands(block), (
            f"{block.id}: command lines in a ```{block.language} block, which the docs "
            f"test does not run: {misplaced_commands(block)[:2]}; use ```bash (run), or "
            "```text with placeholders for a synopsis")
        if block.not_run is not None:
            assert block.language == "bash", f"{block.id}: the not-run marker is for bash"
    assert not indented_commands(ROOT / page), f"{page}: commands in an indented block"


def test_the_pages_have_blocks_to_run_and_few_left_out():
    runnable = sum(len(_runnable(page_name(p))) for p in _PAGES)
    assert runnable >= 12, runnable
    assert {page_name(p) for p in _PAGES if _runnable(page_name(p))} >= {
        "README.md", "docs/analyze.md", "docs/evaluate.md", "docs/predict.md",
        "docs/sources.md"}
    assert len(NOT_RUN) <= MAX_NOT_RUN, [f"{b.id}: {b.not_run}" for b in NOT_RUN]
    for block in NOT_RUN:
        assert len(block.not_run) >= 10, f"{block.id}: say why it is not run"


@pytest.mark.parametrize("block", NOT_RUN, ids=[b.id for b in NOT_RUN])
def test_a_block_marked_not_run_is_listed_with_its_reason(block):
    assert block.first_line, f"{block.id}: an empty block"
    pytest.skip(f"not run: {block.page} `{block.first_line}`: {block.not_run}")


@pytest.mark.parametrize("page", sorted(p for p in PENDING if (ROOT / p).exists()))
def test_a_page_not_yet_run_is_listed_with_its_reason(page):
    pytest.skip(f"not run: {page}: {PENDING[page]}")


def _environment(tmp: Path) -> dict[str, str]:
    """An activated environment: this interpreter's folder on PATH (``python``), and
    first a ``capsmed`` that runs this checkout (an installed script may run another);
    user data (the bench results) inside the temporary folder; an 80-column terminal."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "capsmed"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m capsmed "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPSMED_")}
    path = [str(bin_dir), str(Path(sys.executable).parent), env["PATH"]]
    env.update(PATH=os.pathsep.join(path), COLUMNS="80",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
               XDG_DATA_HOME=str(tmp / "user-data"), MPLBACKEND="Agg",
               MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")  # a test phones no one
    # README "Speed on CPU": on shared cores, spinning OpenMP threads slow every run
    # (docs/analyze.md's commands took 144 s without it, 82 s with it, back to back)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def _fresh_folder(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir()
    for name in ("pipelines", "examples"):
        shutil.copytree(ROOT / name, work / name)
    return work


def _run_block(block: Block, work: Path, env: dict[str, str]) -> float:
    start = time.monotonic()
    try:
        result = subprocess.run(["bash", "-c", _PREAMBLE + block.body], cwd=work, env=env,
                                capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{block.id} `{block.first_line}`: still running after {e.timeout} s")
    tail = "\n".join(result.stderr.splitlines()[-STDERR_TAIL:])
    assert result.returncode == 0, (
        f"{block.id}: the block starting `{block.first_line}` failed "
        f"(exit {result.returncode}); stderr ends:\n{tail}")
    for word in ("Traceback", "error:"):
        assert word not in result.stderr, (
            f"{block.id} `{block.first_line}` exited 0 but printed {word!r}:\n{tail}")
    return time.monotonic() - start


def _assert_datasets_are_usable(page: str, work: Path) -> None:
    """A dataset a page makes holds enough to train on: a handful of patches is not an
    example (docs/sources.md once made 4 training patches)."""
    from capsmed.data.contract import read_info

    for path in sorted(work.rglob("*.h5")):
        sizes = read_info(path).split_sizes
        first = next(s for s in ("train", "all", "test") if s in sizes)
        assert sizes[first] >= 20, f"{page}: {path.relative_to(work)} holds {sizes}"


@pytest.mark.slow
@pytest.mark.parametrize("page", [page_name(p) for p in _PAGES if _runnable(page_name(p))])
def test_the_commands_of_a_page_run_as_written_in_order(page, tmp_path):
    env, work = _environment(tmp_path), _fresh_folder(tmp_path)
    seconds = [(b, _run_block(b, work, env)) for b in _runnable(page)]
    _assert_datasets_are_usable(page, work)
    print(f"\n{page}: {len(seconds)} blocks in {sum(s for _, s in seconds):.0f} s")
    for block, s in seconds:
        print(f"  {s:6.1f} s  {block.id}  {block.first_line[:50]}")
