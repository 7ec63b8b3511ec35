"""The IDX file format of MNIST and Fashion-MNIST: read and write, plain or gzipped.

An IDX file is a big-endian header followed by the raw array in C order::

    bytes 0-1  zero
    byte  2    element type: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
               0x0D float32, 0x0E float64
    byte  3    number of dimensions D
    then D big-endian uint32 sizes, then prod(sizes) elements

So the MNIST image files start with the magic number 2051 (0x00000803: uint8, three
dimensions N x 28 x 28) and the label files with 2049 (0x00000801: uint8, N). A file
is accepted only if its length is exactly header + data: a truncated download or a
file of another kind fails with one line naming it.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from capsmed.errors import CapsmedError
from capsmed.io import atomic_path

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049

# IDX type code -> big-endian numpy dtype.
_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES = {dt.newbyteorder("=").str[1:]: code for code, dt in _DTYPES.items()}
_GZIP_SIGNATURE = b"\x1f\x8b"


def _read_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when it is a gzip file (told by its signature)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CapsmedError(f"{path}: cannot read ({exc.strerror})") from exc
    if raw[:2] != _GZIP_SIGNATURE:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        # EOFError: the archive ends early (an interrupted download).
        raise CapsmedError(f"{path}: corrupt or truncated gzip file ({exc})") from exc


def parse_idx(data: bytes, name: str = "<bytes>") -> np.ndarray:
    """Decode IDX ``data`` into a native-endian numpy array.

    Args:
        data: The uncompressed file content.
        name: How to name the file in error messages.

    Raises:
        CapsmedError: the header is not IDX or the length does not match the header.
    """
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise CapsmedError(f"{name}: not an IDX file (bad magic number "
                           f"{int.from_bytes(data[:4], 'big') if len(data) >= 4 else 'n/a'})")
    code, ndim = data[2], data[3]
    if code not in _DTYPES or ndim == 0:
        raise CapsmedError(f"{name}: not an IDX file (magic {int.from_bytes(data[:4], 'big')}: "
                           f"type 0x{code:02X}, {ndim} dimensions)")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise CapsmedError(f"{name}: truncated IDX header ({len(data)} bytes)")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    dtype = _DTYPES[code]
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        problem = "truncated" if len(data) < expected else "has trailing bytes"
        raise CapsmedError(f"{name}: {problem}: header says {'x'.join(map(str, shape))} "
                           f"{dtype.name} ({expected:,} bytes) but the data is "
                           f"{len(data):,} bytes")
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=False)


def read_idx(path: Path, magic: int | None = None) -> np.ndarray:
    """Read an IDX file (plain or ``.gz``), optionally requiring a magic number.

    Args:
        path: The file.
        magic: Required magic number, e.g. :data:`IMAGES_MAGIC` or :data:`LABELS_MAGIC`.

    Raises:
        CapsmedError: unreadable, not IDX, truncated, or a different magic number.
    """
    path = Path(path)
    data = _read_bytes(path)
    if magic is not None and len(data) >= 4:
        found = int.from_bytes(data[:4], "big")
        if found != magic:
            kind = {IMAGES_MAGIC: "images", LABELS_MAGIC: "labels"}.get(magic, "IDX")
            raise CapsmedError(f"{path}: wrong magic number {found}, expected {magic} "
                               f"(an IDX {kind} file)")
    return parse_idx(data, str(path))


def read_idx_images(path: Path) -> np.ndarray:
    """Read an IDX image file (magic 2051) as uint8 [N, H, W]."""
    images = read_idx(path, IMAGES_MAGIC)
    if images.dtype != np.uint8 or images.ndim != 3:
        raise CapsmedError(f"{path}: expected uint8 N x H x W images, got {images.dtype} "
                           f"{images.shape}")
    return images


def read_idx_labels(path: Path) -> np.ndarray:
    """Read an IDX label file (magic 2049) as uint8 [N]."""
    labels = read_idx(path, LABELS_MAGIC)
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise CapsmedError(f"{path}: expected uint8 N labels, got {labels.dtype} "
                           f"{labels.shape}")
    return labels


def encode_idx(array: np.ndarray) -> bytes:
    """The IDX bytes of ``array`` (uint8, int8, int16, int32, float32 or float64)."""
    array = np.asarray(array)
    key = array.dtype.newbyteorder("=").str[1:]
    if key not in _CODES or array.ndim == 0:
        raise ValueError(f"cannot encode {array.dtype} array of shape {array.shape} as IDX")
    code = _CODES[key]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array, dtype=_DTYPES[code]).tobytes()


def write_idx(path: Path, array: np.ndarray) -> Path:
    """Write ``array`` as IDX, gzipped when ``path`` ends in ``.gz`` (atomically).

    The gzip header carries no timestamp, so the same array gives the same bytes.
    """
    path = Path(path)
    data = encode_idx(array)
    with atomic_path(path) as tmp:
        if path.suffix == ".gz":
            # Level 6: ~3x faster than gzip's default 9 for a few percent more bytes.
            with tmp.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                      compresslevel=6, mtime=0) as gz:
                gz.write(data)
        else:
            tmp.write_bytes(data)
    return path
