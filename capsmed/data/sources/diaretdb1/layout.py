"""DIARETDB1 v1.1 on disk: where the files are and how to read them.

``resources/images/ddb1_fundusimages/imageNNN.png`` (RGB), the four fused confidence
maps per image under ``resources/images/ddb1_groundtruth/<lesion>/`` (channel 0),
``resources/images/ddb1_fundusmask/fmask.tif`` and the official split lists
``resources/traindatasets/trainset.txt`` / ``resources/testdatasets/testset.txt``.
Every failure is one line naming the file.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from capsmed.data.files import FolderWalk, find_in_folder, refuse_same_stem
from capsmed.data.images import check_image_file, opaque, read_tiff
from capsmed.data.sources.diaretdb1.config import LESION_TYPES
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)

CLASS_NAMES = ("healthy", "lesion")
SPLITS = ("train", "val", "test")
IMAGES_DIR = "images/ddb1_fundusimages"
GROUND_TRUTH_DIR = "images/ddb1_groundtruth"
FUNDUS_MASK = "images/ddb1_fundusmask/fmask.tif"
TRAIN_LIST = "traindatasets/trainset.txt"
TEST_LIST = "testdatasets/testset.txt"
# v1.1 names images imageNNN.png; v2.1 diaretdb1_imageNNN.png. Lists may give bare names,
# relative paths, or a path followed by ground-truth files: the image token is enough.
_IMAGE_NAME = re.compile(r"^(?:diaretdb1_)?(image\d{3})$")


@dataclass(frozen=True)
class ImageRecord:
    """One fundus image (``image_id`` like ``image001``) and its four confidence maps."""

    image_id: str
    png: Path
    ground_truth: dict[str, Path]


def locate_resources(raw_dir: Path) -> Path:
    """The ``resources`` folder of a v1.1 tree given it, its parent, or the release's parent."""
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise CapsmedError(f"{raw_dir}: no such folder (expected the unpacked DIARETDB1 v1.1 "
                           "release, the folder holding resources/)")
    for candidate in (raw_dir / "resources", raw_dir):
        if (candidate / IMAGES_DIR).is_dir():
            return candidate
    if not (raw_dir / "resources").exists():
        found = sorted(c / "resources" for c in raw_dir.iterdir()
                       if (c / "resources" / IMAGES_DIR).is_dir())
        if len(found) == 1:
            return found[0]
        if found:
            raise CapsmedError(f"{raw_dir}: holds several DIARETDB1 trees "
                               f"({', '.join(str(f.parent.name) for f in found)}); pass one")
    raise CapsmedError(f"{raw_dir / 'resources' / IMAGES_DIR}: no such folder (expected "
                       "DIARETDB1 v1.1 fundus images resources/images/ddb1_fundusimages/"
                       "imageNNN.png)")


def discover(raw_dir: Path) -> tuple[Path, list[ImageRecord]]:
    """Find the fundus images and their ground-truth maps; returns ``(resources, records)``."""
    resources = locate_resources(raw_dir)
    pngs = refuse_same_stem([p for p in FolderWalk().files(resources / IMAGES_DIR, (".png",),
                                                           recursive=False)
                             if _IMAGE_NAME.match(p.stem)])
    if not pngs:
        raise CapsmedError(f"{resources / IMAGES_DIR}: no imageNNN.png fundus images found")
    for kind in LESION_TYPES:
        if not (resources / GROUND_TRUTH_DIR / kind).is_dir():
            raise CapsmedError(f"{resources / GROUND_TRUTH_DIR / kind}: no such folder "
                               "(expected the fused ground-truth maps of every lesion type)")
    maps = {k: resources / GROUND_TRUTH_DIR / k for k in LESION_TYPES}
    return resources, [ImageRecord(p.stem, p, {
        k: find_in_folder(folder, p.stem, ".png") or folder / p.name
        for k, folder in maps.items()}) for p in pngs]


def fundus_mask_path(resources: Path) -> Path:
    """``fmask.tif`` of a v1.1 tree (its extension in any case); the expected path when
    it is missing, so that the read names it."""
    mask = resources / FUNDUS_MASK
    return find_in_folder(mask.parent, mask.stem, mask.suffix) or mask


def read_split_list(path: Path) -> list[str]:
    """Image ids (``imageNNN``) of a split list, in order; blank lines and ``#`` skipped."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise CapsmedError(f"{path}: split list not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CapsmedError(f"{path}: cannot read split list ({exc})") from exc
    ids: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):  # CRLF and CR too
        tokens = re.split(r"[\s,;]+", line.split("#", 1)[0].strip())
        names = [m.group(1) for t in tokens if t
                 and (m := _IMAGE_NAME.match(Path(t.replace("\\", "/")).stem))]
        distinct = list(dict.fromkeys(names))
        if len(distinct) > 1:  # only the first was kept: the others left the split unsaid
            raise CapsmedError(f"{path}: line {number}: names {len(distinct)} images "
                               f"({', '.join(distinct[:4])}); give one image per line")
        if names and names[0] not in ids:
            ids.append(names[0])
        elif not names and any(tokens):
            raise CapsmedError(f"{path}: line {number}: no DIARETDB1 image name in "
                               f"{line.strip()!r} (expected e.g. "
                               "images/ddb1_fundusimages/image001.png)")
    return ids


def _read_png(path: Path, what: str, first_channel: bool = False) -> np.ndarray:
    if path.exists() or path.is_symlink():
        check_image_file(path, what)
    try:
        with Image.open(path) as image:
            if getattr(image, "n_frames", 1) > 1:  # as OpenCV's read of it is refused
                raise CapsmedError(f"{path}: an animation of {image.n_frames} frames, not "
                                   f"one {what}; save the frame to use as its own file")
            image.load()
            if image.mode == "P":  # a transparent palette entry stays transparent
                image = image.convert("RGBA" if "transparency" in image.info else "RGB")
            elif image.mode in ("RGB", "L") and "transparency" in image.info:
                image = image.convert(image.mode + "A")  # a colour key (tRNS), as OpenCV
            if first_channel and len(image.getbands()) > 1:
                image = image.getchannel(0)  # a third of the copying np.asarray would do
            return np.asarray(image)
    except FileNotFoundError:
        raise CapsmedError(f"{path}: missing {what}") from None
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError
            ) as exc:  # truncated, not a PNG, too large
        raise CapsmedError(f"{path}: cannot read {what} ({exc})") from exc


def read_rgb_png(path: Path) -> np.ndarray:
    """A fundus image as (H, W, 3) uint8 RGB, or a one-line error naming the file. An
    alpha channel is dropped when opaque and refused otherwise, as predict does."""
    image = _read_png(path, "fundus image")
    if image.ndim != 3 or image.shape[2] not in (3, 4) or image.dtype != np.uint8:
        raise CapsmedError(f"{path}: expected an 8-bit RGB image, got {image.dtype} "
                           f"{image.shape}")
    return np.ascontiguousarray(opaque(path, image, "DIARETDB1"))


def read_confidence_map(path: Path, shape: tuple[int, int], image_name: str) -> np.ndarray:
    """Channel 0 of a fused confidence map as (H, W) uint8, checked against ``shape``."""
    values = _read_png(path, "ground-truth map", first_channel=True)
    if values.dtype != np.uint8 or values.shape != shape:
        size = "x".join(map(str, values.shape[1::-1] if values.ndim == 2 else values.shape))
        raise CapsmedError(f"{path}: ground-truth map is {values.dtype} {size}, expected "
                           f"uint8 {shape[1]}x{shape[0]} like {image_name}")
    return values


def read_fundus_mask(path: Path) -> np.ndarray:
    """The field-of-view mask (``fmask.tif``) as (H, W) bool: its bright pixels, as the
    TIFF looks (MINISWHITE inverted, a palette looked up, planar storage handled). An
    alpha or other extra sample is dropped when uniform and refused otherwise: the
    field of view may be in it, and counting an opaque alpha would make it everything."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        raise CapsmedError(f"{path}: fundus mask not found")
    mask, extras = read_tiff(path)  # one-line errors naming the file
    if mask.ndim == 3:  # grey or RGB, then len(extras) extra samples
        colours = mask.shape[-1] - len(extras)
        extra = mask[..., max(colours, 1):]
        if extra.size and (extra != extra.flat[0]).any():
            raise CapsmedError(f"{path}: the fundus mask has a non-uniform alpha (extra) "
                               "channel; save the field of view as a plain grey mask")
        mask = mask[..., :max(colours, 1)].max(axis=-1)  # the channels of a mask agree
    if mask.ndim != 2 or not mask.any():
        raise CapsmedError(f"{path}: expected a non-empty 2-D fundus mask, got {mask.shape}")
    return mask > mask.max() / 2
