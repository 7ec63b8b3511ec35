"""The content digest of a file: what a run's identity and its resume checks compare.

One function for every command (STYLE 14): the pipeline runner keys each run on its
input file's digest, so a dataset that is rebuilt with other contents gives its runs
new identities. Digests are cached per process by (path, size, mtime, inode), so
expanding a grid of hundreds of runs over one file reads it once.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from capsmed.errors import CapsmedError

CHUNK = 8 << 20
_cache: dict[tuple[str, int, int, int], str] = {}


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of the file's bytes."""
    path = Path(path)
    try:
        st = os.stat(path)
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
        if key in _cache:
            return _cache[key]
        h = hashlib.sha256()
        with path.open("rb") as fh:
            while block := fh.read(CHUNK):
                h.update(block)
    except OSError as exc:
        raise CapsmedError(f"{path}: cannot read ({exc.strerror})") from exc
    _cache[key] = f"sha256:{h.hexdigest()}"
    return _cache[key]
