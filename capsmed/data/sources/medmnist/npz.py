"""Reading a NumPy ``.npz`` archive safely and in bounded memory.

An ``.npz`` is a zip of ``.npy`` files. ``np.load`` reads a whole member at once (16 GB
for PathMNIST at 224 px) and, with ``allow_pickle=True``, would run any code a pickled
member carries. Here each member's header is parsed first (``np.lib.format``, which
reads the header dictionary with ``ast.literal_eval``), a member holding Python objects
is refused without reading its body, and the data are read as raw bytes, a chunk of
rows at a time, from the zip stream (which checks the member's CRC at its end).
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from capsmed.errors import CapsmedError

CHUNK_BYTES = 64 << 20  # rows read at a time: bounded memory for the 224 px files
_PICKLE = b"\x80"  # a pickle stream (protocol 2+) starts with PROTO
_NPY = b"\x93NUMPY"


@dataclass(frozen=True)
class Member:
    """One array of the archive, described by its header (its body not read)."""

    name: str  # without ".npy"
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 0


def _read_header(path: Path, name: str, fp: IO[bytes]) -> Member:
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except (ValueError, SyntaxError, EOFError) as exc:
        raise CapsmedError(f"{path}: member {name}.npy is not a NumPy array ({exc})") from None
    if dtype.hasobject:
        raise CapsmedError(f"{path}: {name} holds Python objects (a pickled array); "
                           "refused without unpickling it")
    return Member(name, dtype, tuple(int(v) for v in shape), bool(fortran))


class NpzArchive:
    """An open ``.npz`` file: its members' headers, and their data read row by row.

    Use as a context manager.

    Raises:
        CapsmedError: the file is missing, is not a zip archive (a pickle, a single
            ``.npy``, anything else), or a member is not a plain NumPy array.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CapsmedError(f"{self.path}: no such file" + (" (a folder)" if
                                                                 self.path.is_dir() else ""))
        if not zipfile.is_zipfile(self.path):
            with self.path.open("rb") as fh:
                head = fh.read(8)
            what = ("a single .npy array" if head.startswith(_NPY) else
                    "a Python pickle (refused: unpickling runs code)"
                    if head.startswith(_PICKLE) else "not a zip archive")
            raise CapsmedError(f"{self.path}: {what}; expected a .npz archive of .npy "
                               "arrays as MedMNIST publishes")
        try:
            self._zip = zipfile.ZipFile(self.path)
            self.members = {}
            for info in self._zip.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                name = info.filename[:-4]
                with self._zip.open(info) as fp:
                    self.members[name] = _read_header(self.path, name, fp)
        except NotImplementedError as exc:  # a member zipped with Deflate64, say
            self.close()
            raise CapsmedError(f"{self.path}: {exc}; re-save it with np.savez or "
                               "np.savez_compressed") from None
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError, CapsmedError) as exc:
            self.close()
            if isinstance(exc, CapsmedError):
                raise
            raise CapsmedError(f"{self.path}: cannot read the archive ({exc}); the file "
                               "is damaged or truncated") from None

    def close(self) -> None:
        """Close the archive (also on a failed open)."""
        if getattr(self, "_zip", None) is not None:
            self._zip.close()

    def __enter__(self) -> NpzArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, name: str) -> np.ndarray:
        """A whole member (for small arrays such as labels)."""
        parts = list(self.chunks(name, rows=max(1, self.members[name].rows)))
        member = self.members[name]
        return np.concatenate(parts) if parts else np.empty(member.shape, member.dtype)

    def chunks(self, name: str, rows: int | None = None) -> Iterator[np.ndarray]:
        """Member ``name`` in consecutive blocks of rows (about :data:`CHUNK_BYTES`)."""
        member = self.members[name]
        if member.fortran_order or not member.shape:
            raise CapsmedError(f"{self.path}: {name} is stored "
                               f"{'in Fortran order' if member.shape else 'as a scalar'}; "
                               "expected a C-ordered array (np.savez writes one)")
        row_bytes = member.dtype.itemsize * int(np.prod(member.shape[1:], dtype=np.int64))
        step = rows or max(1, CHUNK_BYTES // max(1, row_bytes))
        try:
            with self._zip.open(f"{name}.npy") as fp:
                _read_header(self.path, name, fp)
                for start in range(0, member.rows, step):
                    count = min(step, member.rows - start)
                    data = fp.read(count * row_bytes)
                    if len(data) != count * row_bytes:
                        raise CapsmedError(f"{self.path}: {name} ends after "
                                           f"{start + len(data) // max(1, row_bytes)} of "
                                           f"{member.rows} rows (truncated)")
                    yield np.frombuffer(data, member.dtype).reshape(count, *member.shape[1:])
                if fp.read(1):
                    raise CapsmedError(f"{self.path}: {name} holds more bytes than its "
                                       f"header's shape {list(member.shape)}")
        except NotImplementedError as exc:  # a member zipped with Deflate64, say
            raise CapsmedError(f"{self.path}: {name}: {exc}; re-save it with np.savez or "
                               "np.savez_compressed") from None
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as exc:
            raise CapsmedError(f"{self.path}: cannot read {name} ({exc}); the file is "
                               "damaged or truncated") from None
