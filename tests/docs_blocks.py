"""The code blocks of README.md and docs/*.md, as tests/test_docs_run.py reads them.

The convention the pages follow (docs/develop.md, "Documentation"):

- a fenced ```` ```bash ```` block is commands a reader types; the test runs it;
- ```` <!-- docs-test: not run (REASON) --> ```` on the line before a ```bash block
  marks one that cannot run on a CPU machine without downloads (a download, a GPU, a
  Slurm cluster, a real-scale training); it is listed, with REASON, as a skipped test;
- a fenced ```` ```text ```` block holding ``capsmed`` lines is a synopsis: each such
  line has placeholders (``RUN_DIR``, ``[--split test]``, ``A|B``, ``...``);
- no other block (untagged, ``yaml``, ``python``, an indented block) holds a command line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_NOT_RUN = re.compile(r"<!--\s*docs-test:\s*not run\s*\((?P<reason>[^)]*(?:\([^)]*\)[^)]*)*)\)"
                      r"\s*-->\s*\Z")
_MARKER = re.compile(r"<!--\s*docs-test:")
# the start of a line a reader would type into a shell
COMMAND = re.compile(r"^\s*(\$ )?(capsmed|make|python|torchrun|pip|printf|cat|bash) ")
# synopsis notation: [optional parts], A|B, ..., UPPER_CASE placeholders (RUN_DIR, FILE.h5)
_PLACEHOLDER = re.compile(r"[\[\]|]|\.\.\.|\b[A-Z][A-Z0-9_]{2,}\b")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str            # README.md, docs/analyze.md, ...
    line: int            # 1-based line of the opening fence
    language: str        # the fence's info string: bash, text, yaml, "" ...
    body: str
    not_run: str | None  # the reason given by a docs-test marker, if any

    @property
    def first_line(self) -> str:
        """The block's first non-empty line, as a failure message names it."""
        return next((ln.strip() for ln in self.body.splitlines() if ln.strip()), "")

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def page_name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def read_blocks(path: Path) -> list[Block]:
    """Every fenced block of the page, in order, with its not-run reason."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in _FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _NOT_RUN.search(before)
        if _MARKER.search(before) and marker is None:
            raise ValueError(f"{page_name(path)}: malformed docs-test marker {before!r}; "
                             "write <!-- docs-test: not run (REASON) -->")
        blocks.append(Block(page=page_name(path), line=text.count("\n", 0, match.start()) + 1,
                            language=match.group(1).strip(), body=match.group(2),
                            not_run=marker.group("reason").strip() if marker else None))
    return blocks


def indented_commands(path: Path) -> list[str]:
    """Command lines in indented (4-space) code blocks: the test would never run them."""
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    return [line.strip() for line in text.splitlines()
            if line.startswith("    ") and COMMAND.match(line)]


def misplaced_commands(block: Block) -> list[str]:
    """The lines of a block that break the convention above (empty when it follows it)."""
    lines = [ln for ln in block.body.replace("\\\n", " ").splitlines() if COMMAND.match(ln)]
    if block.language == "bash":
        return []
    if block.language == "text":
        return [ln for ln in lines if not _PLACEHOLDER.search(ln.split("#")[0])]
    return lines
