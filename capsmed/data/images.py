"""Reading image files of any common format into uint8 arrays.

TIFF (by its name or its first bytes) through tifffile, everything else through OpenCV
(``IMREAD_UNCHANGED``, so 16-bit and alpha survive), then 8-bit scaling, channel
conversion and resizing. Every failure
is a one-line :class:`CapsmedError` naming the file. :func:`check_image_file` runs
before any decoder: an empty file, or a header claiming an absurd size (a corrupt or
hostile file), is refused before a decoder allocates memory or raises its own error.
"""

from __future__ import annotations

import contextlib
import logging
import re
import struct
import warnings
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import tifffile

from capsmed.data.files import check_file, shown
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)

# OpenCV's own limit (CV_IO_MAX_IMAGE_PIXELS): 32768 x 32768. A larger plain image is a
# whole slide, which `capsmed preprocess wsi` reads tile by tile.
MAX_IMAGE_PIXELS = 1 << 30
# Image formats capsmed's folder readers do not read (the class-folder source, predict's
# input folders): refused there, as left out a class or a prediction would be missing.
UNREAD_IMAGE_EXTENSIONS = frozenset(
    (".webp", ".gif", ".pgm", ".ppm", ".pbm", ".pnm", ".jp2", ".j2k", ".jpx", ".jxl",
     ".heic", ".heif", ".avif", ".dcm", ".dicom", ".tga", ".exr", ".hdr", ".svs", ".ndpi",
     ".mrxs", ".scn", ".vms", ".czi", ".nii", ".nrrd", ".mha", ".mhd"))
TIFF_MAGIC = (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+")  # classic and BigTIFF
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_size(head: bytes) -> tuple[int, int] | None:
    """(width, height) from the first start-of-frame marker of a JPEG's first bytes."""
    i = 2
    while i + 9 <= len(head):
        if head[i] != 0xFF:
            return None
        marker, length = head[i + 1], struct.unpack(">H", head[i + 2:i + 4])[0]
        if marker in _JPEG_SOF:
            height, width = struct.unpack(">HH", head[i + 5:i + 9])
            return width, height
        i += 2 + length
    return None


def header_size(path: Path) -> tuple[int, int] | None:
    """(width, height) as a PNG, JPEG, BMP or TIFF header states it, without decoding;
    None when the format is not one of these or the header cannot be parsed (the
    decoder then reports what is wrong)."""
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    if head.startswith(b"\x89PNG\r\n\x1a\n") and len(head) >= 24:
        return struct.unpack(">II", head[16:24])
    if head.startswith(b"\xff\xd8"):
        return _jpeg_size(head)
    if head.startswith(b"BM") and len(head) >= 26:
        if struct.unpack("<I", head[14:18])[0] == 12:  # OS/2 BITMAPCOREHEADER
            return struct.unpack("<HH", head[18:22])
        width, height = struct.unpack("<ii", head[18:26])
        return abs(width), abs(height)
    if head[:4] in TIFF_MAGIC:
        try:
            with tifffile.TiffFile(path) as tif:
                page = tif.pages[0]
                return int(page.imagewidth), int(page.imagelength)
        except Exception:  # a corrupt TIFF: tifffile's own error comes with the read
            return None
    return None


def check_image_file(path: Path, what: str = "image") -> Path:
    """Refuse, before decoding, a broken link, an empty file or a header claiming more
    than :data:`MAX_IMAGE_PIXELS` pixels (a decoder would raise its own error or try
    to allocate it)."""
    check_file(path, what)
    try:
        size = header_size(path)
    except OSError as exc:
        raise CapsmedError(f"{shown(path)}: cannot read {what} ({exc.strerror})") from None
    if size is not None and size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise CapsmedError(f"{shown(path)}: the {what}'s header claims {size[0]}x{size[1]} "
                           f"pixels, more than the {MAX_IMAGE_PIXELS:,} a plain image may "
                           "have (a corrupt file? a whole slide goes to preprocess wsi)")
    return path


@contextlib.contextmanager
def _tifffile_warnings() -> Iterator[list[str]]:
    """Collect what tifffile logs while reading, so it ends up in our one-line error
    (or the debug log) instead of on stderr beside it."""
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(  # type: ignore[method-assign]
        re.sub(r"^<[^>]*> ", "", record.getMessage()))
    logger = logging.getLogger("tifffile")
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def read_tiff(path: Path) -> tuple[np.ndarray, tuple[int, ...]]:
    """The first page of a TIFF as it looks, and its extra-sample codes (alpha kinds).

    The pixels come back as (H, W) grey or (H, W, C) RGB(A) in their stored dtype:
    planar storage is moved to channels-last, MINISWHITE is inverted (0 is white
    there), a palette image is looked up in its colour map and samples of fewer bits
    than their dtype (2-7, 9-15) are scaled to its full range. An interpretation whose
    samples are not grey or RGB (CMYK, Lab, uncompressed YCbCr, ...) is refused: read
    as RGB it would be a different image. So is a stack (pages of channels, z or time):
    its first page alone is not the image. A pyramid's or a thumbnail's extra pages are
    not a stack.
    """
    check_image_file(path)
    with _tifffile_warnings() as warned:
        try:
            with tifffile.TiffFile(path) as tif:
                page = tif.pages[0]
                stack = tif.series[0] if tif.series else None
                image = page.asarray()
                kind, axes, bits = page.photometric, page.axes, page.bitspersample
                extras = tuple(int(e) for e in page.extrasamples)
                colormap, compression = page.colormap, page.compression
        except Exception as exc:  # tifffile raises many types for corrupt files
            raise CapsmedError(f"{path}: cannot read TIFF ({type(exc).__name__}: "
                               f"{exc})") from exc
    if image.size == 0:  # tifffile warns (about a bad offset, ...) and reads nothing
        raise CapsmedError(f"{path}: cannot read TIFF ({'; '.join(warned) or 'no image'})")
    if stack is not None and len(stack.pages) > 1:  # channels, z or time as pages
        raise CapsmedError(f"{path}: a stack of {len(stack.pages)} TIFF pages (axes "
                           f"{stack.axes}, shape {'x'.join(map(str, stack.shape))}), not "
                           "one image; save each page, or an RGB composite of the "
                           "channels, as its own file")
    for message in warned:
        log.debug("%s: %s", path, message)
    if image.ndim == 3 and axes.startswith("S"):
        image = np.moveaxis(image, 0, -1)  # planar (C, H, W) storage
    P = tifffile.PHOTOMETRIC
    if kind == P.MINISWHITE:
        if image.dtype == bool:
            image = ~image
        elif image.dtype.kind == "u":
            image = ((1 << bits) - 1 - image).astype(image.dtype)
        else:
            raise CapsmedError(f"{path}: a {image.dtype} MINISWHITE TIFF is not supported; "
                               "save it as 8- or 16-bit greyscale")
    elif kind == P.PALETTE and colormap is not None:
        colours = colormap if colormap.max() > 255 else colormap.astype(np.uint8)
        image = np.moveaxis(colours[:, image], 0, -1)
    elif not (kind in (P.MINISBLACK, P.RGB)
              or (kind == P.YCBCR and compression == tifffile.COMPRESSION.JPEG)):
        name = "CMYK" if kind == P.SEPARATED else getattr(kind, "name", kind)
        raise CapsmedError(f"{path}: a TIFF with {name} colours cannot be read as RGB or "
                           "grey; save it as RGB or greyscale")
    if kind != P.PALETTE and image.dtype == np.uint8 and 1 < bits < 8:
        # 2- to 7-bit samples come as 0..2**bits - 1: full scale is 255, as in a viewer
        image = np.rint(image * (255.0 / ((1 << bits) - 1))).astype(np.uint8)
    elif kind != P.PALETTE and image.dtype == np.uint16 and 8 < bits < 16:
        # 9- to 15-bit samples (a 12-bit camera) likewise: full scale is 65535, not 4095
        image = np.rint(image * (65535.0 / ((1 << bits) - 1))).astype(np.uint16)
    return image, extras


def _png_grey_alpha(data: np.ndarray) -> bool:
    """Whether the bytes are a PNG whose header says grey + alpha (colour type 4)."""
    return (len(data) > 25 and data[:8].tobytes() == b"\x89PNG\r\n\x1a\n"
            and data[12:16].tobytes() == b"IHDR" and int(data[25]) == 4)


def _frame_count(path: Path, head: bytes) -> int:
    """How many frames a PNG (APNG), GIF or WebP file holds (1 for any other format, or
    when the header cannot be read); ``head``: its first bytes. OpenCV decodes only the
    first frame of an animation."""
    if not (head.startswith((b"\x89PNG", b"GIF8")) or head[8:12] == b"WEBP"):
        return 1  # a multi-picture JPEG (MPO) is one photograph and its extra views
    from PIL import Image  # header only for PNG and WebP; GIF frames are skipped, not decoded

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                return int(getattr(im, "n_frames", 1))
    except Exception:  # a damaged header: the decoder says what is wrong with the file
        return 1


def _is_tiff(path: Path) -> bool:
    """Whether the file starts as a TIFF does, whatever its name (False when unreadable:
    the reader then says what is wrong)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) in TIFF_MAGIC
    except OSError:
        return False


def read_image(path: Path) -> np.ndarray:
    """Read an image as stored: (H, W) or (H, W, C) in RGB(A) order, original dtype.

    TIFF (by name or first bytes) goes through tifffile (first page), everything else
    through OpenCV with ``IMREAD_UNCHANGED`` (so 16-bit and alpha survive; EXIF
    orientation is not applied); an animated PNG, GIF or WebP is refused, as a TIFF
    stack is.
    A grey + alpha PNG comes back as (H, W, 2), as a TIFF does, not as OpenCV's BGRA:
    it is a grey image, which colour-only readers refuse.
    """
    if path.suffix.lower() in (".tif", ".tiff") or _is_tiff(path):
        image, _ = read_tiff(path)  # a TIFF by another name too: OpenCV would read its
        # first page of a stack, and turn it by its orientation tag
    else:
        check_image_file(path)
        try:
            # imdecode on the bytes, because imread cannot tell "missing" from "corrupt"
            data = np.fromfile(path, dtype=np.uint8)
        except OSError as exc:
            raise CapsmedError(f"{path}: cannot read file ({exc.strerror})") from exc
        # OpenCV prints its own decoder warnings to stderr; our one-line error says it all
        level = cv2.utils.logging.getLogLevel()
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
        try:
            image = cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
        finally:
            cv2.utils.logging.setLogLevel(level)
        if image is None:
            raise CapsmedError(f"{path}: cannot decode image (corrupt, truncated or not "
                               f"a {path.suffix[1:].upper()} file)")
        frames = _frame_count(path, data[:12].tobytes())
        if frames > 1:  # as a TIFF stack: the first frame alone is not what it shows
            raise CapsmedError(f"{path}: an animation of {frames} frames, not one image; "
                               "save the frame to use as its own file")
        if image.ndim == 3 and image.shape[-1] >= 3:  # OpenCV stores BGR(A)
            image = image[..., [2, 1, 0, *range(3, image.shape[-1])]]
        if _png_grey_alpha(data) and image.ndim == 3 and image.shape[-1] == 4:
            image = image[..., [0, 3]]  # OpenCV expands grey + alpha to BGRA: grey again
    if image.ndim not in (2, 3) or (image.ndim == 3 and not 1 <= image.shape[-1] <= 4):
        raise CapsmedError(f"{path}: expected a grey or colour 2-D image, got shape "
                           f"{image.shape}")
    return image


def exif_orientation(path: Path) -> int:
    """The orientation tag of a JPEG, PNG or WebP file's EXIF or of a TIFF's first page
    (1, upright, when absent or unreadable); :func:`read_image` does not apply it."""
    if path.suffix.lower() in (".tif", ".tiff"):  # tag 274, as viewers apply it
        try:
            with tifffile.TiffFile(path) as tif:
                value = tif.pages[0].tags.valueof(274, 1)
        except Exception:  # a damaged header: read_tiff says what is wrong with the file
            return 1
        return value if isinstance(value, int) and 1 <= value <= 8 else 1
    if path.suffix.lower() not in (".jpg", ".jpeg", ".png", ".webp"):
        return 1
    from PIL import Image  # header only: Pillow reads no pixels for this

    try:
        with Image.open(path) as im:
            value = im.getexif().get(0x0112, 1)
    except Exception:  # a damaged header: read_image says what is wrong with the file
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def to_uint8(image: np.ndarray, scale16: str, path: Path) -> np.ndarray:
    """Scale an 8/16-bit (or 1-bit) image to uint8.

    ``scale16``: ``full`` maps 0..65535 to 0..255 (``round(v / 257)``, comparable across
    images); ``minmax`` stretches each image's own range.
    """
    if image.dtype == np.uint8:
        return image
    if image.dtype == np.bool_:
        return image.astype(np.uint8) * 255
    if image.dtype != np.uint16:
        raise CapsmedError(f"{path}: unsupported pixel type {image.dtype} (expected 8- or "
                           "16-bit unsigned integers)")
    if scale16 == "full":
        return np.rint(image / 257.0).astype(np.uint8)
    lo, hi = float(image.min()), float(image.max())
    if hi <= lo:  # a constant image has no range to stretch
        return np.zeros(image.shape, np.uint8)
    return np.rint((image - lo) * (255.0 / (hi - lo))).astype(np.uint8)


def convert_channels(image: np.ndarray, channels: int) -> np.ndarray:
    """(H, W[, C]) uint8 -> (H, W, ``channels``). Alpha is dropped, not composited;
    grey comes from RGB by ITU-R 601 luma (OpenCV ``RGB2GRAY``), RGB from grey by copying."""
    if image.ndim == 2:
        image = image[..., None]
    if image.shape[-1] == 2:  # grey + alpha
        image = image[..., :1]
    image = image[..., :3]
    if channels == 1 and image.shape[-1] == 3:
        return cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)[..., None]
    if channels == 3 and image.shape[-1] == 1:
        return np.repeat(image, 3, axis=-1)
    return image


def resize_image(image: np.ndarray, size: int, keep_aspect: bool) -> np.ndarray:
    """Resize (H, W, C) to (size, size, C): stretched, or fitted and centre-padded black.

    INTER_AREA when shrinking (anti-aliased); INTER_LINEAR when enlarging, because
    INTER_AREA enlarges by pixel replication.
    """
    h, w, c = image.shape
    if keep_aspect:
        scale = size / max(h, w)
        th, tw = max(1, round(h * scale)), max(1, round(w * scale))
    else:
        th, tw = size, size
    if (th, tw) != (h, w):
        inter = cv2.INTER_AREA if th * tw < h * w else cv2.INTER_LINEAR
        image = cv2.resize(image, (tw, th), interpolation=inter).reshape(th, tw, c)
    if (th, tw) == (size, size):
        return image
    out = np.zeros((size, size, c), np.uint8)
    top, left = (size - th) // 2, (size - tw) // 2
    out[top:top + th, left:left + tw] = image
    return out


def opaque(path: Path, image: np.ndarray, dataset: str) -> np.ndarray:
    """(H, W[, C]) uint8 without its alpha channel (C 2 or 4), refused when a pixel is
    not opaque: a set without alpha (MNIST, MedMNIST, TUPAC16) never showed the colour
    under a transparent pixel, which is often black, or the whole picture is in the alpha."""
    if image.ndim != 3 or image.shape[-1] not in (2, 4):
        return image
    if int(image[..., -1].min()) < 255:
        raise CapsmedError(f"{path}: has transparent pixels, but {dataset} images have no "
                           "alpha channel; flatten the image onto its background first")
    return image[..., :-1]


def read_rgb_tiff(path: Path, dataset: str = "the training") -> np.ndarray:
    """Read an RGB(A) TIFF as (H, W, 3) uint8, or fail naming the file. An alpha channel
    is dropped when opaque and refused otherwise (:func:`opaque`), as predict does."""
    image, _ = read_tiff(path)
    if image.ndim != 3 or image.shape[-1] not in (3, 4):
        raise CapsmedError(f"{path}: expected an RGB image, got shape {image.shape}")
    if image.dtype != np.uint8:
        if image.dtype == np.uint16:
            image = (image >> 8).astype(np.uint8)
        else:
            raise CapsmedError(f"{path}: expected 8-bit RGB, got {image.dtype}")
    return np.ascontiguousarray(opaque(path, image, dataset))
