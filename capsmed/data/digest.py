"""Digests of files: what a run's identity and its resume checks compare.

One place for both kinds (STYLE 14):

* :func:`file_digest`: ``sha256:`` of a file's bytes (checkpoint weights, raw files,
  and the data digest ``capsmed train`` records in a run's ``config.yaml``);
* :func:`dataset_digest`: the *content* of a dataset file: every array (images,
  labels, groups, folds, per-sample metadata) and the file's record (class names,
  preprocessing parameters, format), but not its bytes, its creation time, the
  capsmed version that wrote it or its provenance (command line, library versions). A
  dataset remade with the same content keeps its digest, so the pipeline runs that read
  it keep their identity.

Both are cached in memory by (path, size, mtime, inode), so expanding a grid of
hundreds of runs over one file reads it once. :func:`keep_digests_in` adds a file of
content digests (JSON lines) that later processes reuse: ``capsmed run status`` then
never re-reads an unchanged dataset.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from capsmed.errors import CapsmedError

CHUNK = 8 << 20
ROWS = 4096  # rows of a dataset hashed at a time
# File attributes that say when or by what a file was written, not what it holds.
NOT_CONTENT = frozenset({"created", "capsmed_version", "source", "provenance"})
_cache: dict[tuple[str, int, int, int, int], str] = {}
_content: dict[tuple[str, int, int, int, int], str] = {}
_store: Path | None = None
_stored: dict[Path, dict[str, str]] = {}


def _key(path: Path) -> tuple[str, int, int, int, int]:
    """What a file's cached digest is kept under. The change time too: a copy made in
    place with its source's modification time (``cp -p``, ``rsync -t --inplace``) keeps
    the inode, and the size when the arrays keep their shapes, but no tool can set the
    change time back."""
    st = os.stat(path)
    return (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of the file's bytes."""
    path = Path(path)
    try:
        key = _key(path)
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


def keep_digests_in(store: Path | None) -> None:
    """Keep content digests in ``store`` (a JSON-lines file) too, and reuse the ones
    there; None: in memory only."""
    global _store
    _store = Path(store) if store is not None else None


def dataset_digest(path: Path) -> str:
    """``content:<hex>``: the digest of what a dataset file holds (module docstring).
    A file that is not HDF5 gets :func:`file_digest` instead."""
    path = Path(path)
    try:
        key = _key(path)
    except OSError as exc:
        raise CapsmedError(f"{path}: cannot read ({exc.strerror})") from exc
    if key in _content:
        return _content[key]
    text = json.dumps(key)
    stored = _read_store().get(text)
    if stored is None:
        stored = _content_digest(path)
        _remember(text, stored)
    _content[key] = stored
    return stored


def _content_digest(path: Path) -> str:
    import h5py

    try:
        if not h5py.is_hdf5(path):
            return file_digest(path)
        h = hashlib.sha256()
        with h5py.File(path, "r") as f:
            _hash_attrs(h, "", f.attrs, skip=NOT_CONTENT)
            names: list[str] = []
            f.visititems(lambda name, obj: names.append(name))
            for name in sorted(names):
                obj = f[name]
                _hash_attrs(h, name, obj.attrs)
                if isinstance(obj, h5py.Dataset):
                    _hash_dataset(h, name, obj)
    except OSError as exc:
        raise CapsmedError(f"{path}: cannot read ({exc})") from exc
    return f"content:{h.hexdigest()}"


def _hash_attrs(h: Any, where: str, attrs: Any, skip: frozenset = frozenset()) -> None:
    for name in sorted(attrs):
        if name in skip:
            continue
        value = attrs[name]
        text = value.tolist() if hasattr(value, "tolist") else value
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        h.update(json.dumps([where, name, text], default=str).encode())


def _hash_dataset(h: Any, name: str, ds: Any) -> None:
    import h5py
    import numpy as np

    h.update(json.dumps([name, str(ds.dtype), list(ds.shape)]).encode())
    if ds.shape == ():
        h.update(np.asarray(ds[()]).tobytes())
        return
    text = h5py.check_string_dtype(ds.dtype) is not None or ds.dtype.kind == "O"
    for start in range(0, ds.shape[0], ROWS):
        block = ds[start:start + ROWS]
        if text:
            for value in np.asarray(block, dtype=object).ravel():
                data = value if isinstance(value, bytes) else str(value).encode()
                h.update(len(data).to_bytes(8, "little") + data)
        else:
            h.update(np.ascontiguousarray(block).tobytes())


def _read_store() -> dict[str, str]:
    if _store is None:
        return {}
    if _store not in _stored:
        found: dict[str, str] = {}
        try:
            lines = _store.read_text(encoding="utf-8").splitlines()
        except OSError:
            lines = []
        for line in lines:  # a line cut by a crash is skipped
            try:
                entry = json.loads(line)
                found[str(entry["key"])] = str(entry["digest"])
            except (ValueError, KeyError, TypeError):
                continue
        _stored[_store] = found
    return _stored[_store]


def _remember(key: str, digest: str) -> None:
    if _store is None:
        return
    _read_store()[key] = digest
    # a read-only folder: the digest is computed again next time, nothing else is lost
    with contextlib.suppress(OSError):
        _store.parent.mkdir(parents=True, exist_ok=True)
        with _store.open("a", encoding="utf-8") as fh:  # one write: whole lines
            fh.write(json.dumps({"key": key, "digest": digest}) + "\n")
