"""AML-Cytomorphology_LMU (Matek et al. 2019) -> HDF5 contract, paper 001's protocol.

The TCIA release is two downloads: the images, which unpack to
``AML-Cytomorphology/<CLS>/<CLS>_NNNN.tiff`` (RGBA TIFF, about 400x400), and
``annotations.dat``. :func:`~capsmed.data.sources.aml.layout.locate` accepts ``raw_dir`` as

* the folder holding ``AML-Cytomorphology/`` and ``annotations.dat``
  (``annotations.dat`` may also sit inside ``AML-Cytomorphology/``), or
* ``AML-Cytomorphology/`` itself, with ``annotations.dat`` inside it or beside it;

an explicit ``annotations`` path overrides the search.

``annotations.dat`` has no header; each line holds four whitespace-separated fields:
the image path relative to ``AML-Cytomorphology/`` (``BAS/BAS_0001.tiff``), the original
label, and two re-annotations (``nan``: not re-annotated, ``UNC``: undecidable).

All images go to one split, ``all``, with stratified, seeded k folds (paper 001 uses
5-fold CV). The release has no patient ids, so each image is its own group.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

from capsmed.data.contract import DatasetWriter
from capsmed.data.images import read_tiff
from capsmed.data.output import claims_output
from capsmed.data.pool import default_workers, map_in_workers
from capsmed.data.resume import ResultCache
from capsmed.data.sources.aml import SOURCE
from capsmed.data.sources.aml.config import AmlConfig
from capsmed.data.sources.aml.layout import (
    CLASS_NAMES,
    CLASSES,
    NOT_REANNOTATED,
    gather_records,
    locate,
)
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)

_SHOWN = 20  # names listed in the record before "and N more" (attributes stay small)


def assign_folds(labels: np.ndarray, folds: int, seed: int, source: Path) -> np.ndarray:
    """Stratified, seeded fold of each sample (scikit-learn ``StratifiedKFold``).

    Each class is spread over the folds with per-fold counts differing by at most one;
    a class with fewer members than folds is absent from some folds (logged, no error).
    Too many folds for the images is refused, naming ``source`` (the annotations that
    list them).
    """
    from sklearn.model_selection import StratifiedKFold

    if len(labels) < folds:
        raise CapsmedError(f"{source}: {len(labels)} image(s) cannot be split into {folds} "
                           "folds; use fewer --folds")
    counts = Counter(labels.tolist())
    largest, most = max(counts.items(), key=lambda item: item[1])
    if most < folds:  # StratifiedKFold cannot spread any class over every fold
        raise CapsmedError(f"{source}: every class has fewer images than the {folds} "
                           f"folds (the largest, {CLASS_NAMES[largest]}, has {most}); use "
                           f"--folds {most} or fewer")
    small = sorted(CLASS_NAMES[c] for c, n in counts.items() if n < folds)
    if small:
        log.warning("class(es) %s have fewer images than folds (%d) and are missing from "
                    "some folds", ", ".join(small), folds)
    out = np.empty(len(labels), dtype=np.int8)
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    with warnings.catch_warnings():  # the small-class warning is logged above instead
        warnings.simplefilter("ignore", UserWarning)
        for k, (_, test) in enumerate(splitter.split(np.zeros(len(labels)), labels)):
            out[test] = k
    return out


def read_rgba_as_rgb(path: Path) -> tuple[np.ndarray, bool]:
    """Read an RGB(A) TIFF as (H, W, 3) uint8 composited over white.

    The TIFF ExtraSamples tag says what a 4th sample is: unassociated alpha is blended
    ``rgb*a + 255*(1-a)``, associated (premultiplied) alpha ``rgb + 255*(1-a)``, and an
    unspecified extra sample is not alpha and is dropped. The release's alpha is opaque,
    so this equals dropping it there.

    Returns:
        The RGB image and whether any pixel was less than fully opaque.
    """
    image, extras = read_tiff(path)
    if image.ndim != 3 or image.shape[-1] not in (3, 4):
        raise CapsmedError(f"{path}: expected an RGB(A) image, got shape {image.shape}")
    if image.dtype == np.uint16:
        image = (image >> 8).astype(np.uint8)
    elif image.dtype != np.uint8:
        raise CapsmedError(f"{path}: expected 8-bit RGB(A), got {image.dtype}")
    rgb = image[..., :3]
    if image.shape[-1] == 3 or not extras or int(extras[0]) == 0:
        return np.ascontiguousarray(rgb), False
    alpha = image[..., 3:].astype(np.float32) / 255.0
    if alpha.min() >= 1.0:
        return np.ascontiguousarray(rgb), False
    colour = rgb.astype(np.float32) * (1.0 if int(extras[0]) == 1 else alpha)
    return np.clip(np.rint(colour + 255.0 * (1.0 - alpha)), 0, 255).astype(np.uint8), True


@dataclass(frozen=True)
class _Chunk:
    root: Path
    relpaths: tuple[str, ...]
    size: int
    grey: bool


@dataclass
class _ChunkResult:
    images: np.ndarray  # uint8 [n, C, size, size]
    shapes: np.ndarray  # int32 [n, 2] source (height, width)
    translucent: np.ndarray  # bool [n]: the alpha channel changed some pixel


def cell_image(rgb: np.ndarray, size: int, grey: bool) -> np.ndarray:
    """(H, W, 3) uint8 -> (C, size, size): INTER_AREA resize (non-square stretched),
    then luma (RGB2GRAY) when ``grey``."""
    small = cv2.resize(rgb, (size, size), interpolation=cv2.INTER_AREA)
    if grey:
        return cv2.cvtColor(small, cv2.COLOR_RGB2GRAY)[None]
    return np.ascontiguousarray(small.transpose(2, 0, 1))


def process_chunk(chunk: _Chunk) -> _ChunkResult:
    """Read, convert and resize a chunk of images (runs in a worker)."""
    images, shapes, translucent = [], [], []
    for rel in chunk.relpaths:
        rgb, blended = read_rgba_as_rgb(chunk.root / rel)
        shapes.append(rgb.shape[:2])
        translucent.append(blended)
        images.append(cell_image(rgb, chunk.size, chunk.grey))
    return _ChunkResult(np.stack(images), np.asarray(shapes, dtype=np.int32).reshape(-1, 2),
                        np.asarray(translucent, dtype=bool))


def _chunk_inputs(chunk: _Chunk) -> list[Path]:
    """The images a chunk reads: its cached result is reused only while they are unchanged."""
    return [chunk.root / rel for rel in chunk.relpaths]


def _size_summary(shapes: np.ndarray) -> dict[str, object]:
    counts = Counter(f"{h}x{w}" for h, w in shapes.tolist())
    common = dict(counts.most_common(_SHOWN))
    if len(counts) > _SHOWN:
        common["other"] = int(sum(counts.values()) - sum(common.values()))
    return {"histogram": common, "min_hw": shapes.min(axis=0).tolist(),
            "max_hw": shapes.max(axis=0).tolist(),
            "non_square": int((shapes[:, 0] != shapes[:, 1]).sum())}


@claims_output
def preprocess_aml(raw_dir: Path, output: Path, config: AmlConfig | None = None,
                   annotations: Path | None = None,
                   disable_progress: bool | None = None, overwrite: bool = False) -> Path:
    """Turn the AML-Cytomorphology_LMU release into one HDF5 dataset file (atomically).

    Args:
        raw_dir: The folder holding ``AML-Cytomorphology/`` or that folder itself.
        output: The ``.h5`` file to write.
        config: Processing parameters (defaults: 28x28 RGB, original labels, 5 folds).
        annotations: ``annotations.dat`` if not in one of the searched places.
        disable_progress: Hide the progress bar.
        overwrite: Replace ``output`` if it exists (otherwise that is an error).

    Returns:
        ``output``.
    """
    cfg = config or AmlConfig()
    raw_dir, output = Path(raw_dir), Path(output)
    root, ann_path = locate(raw_dir, annotations)
    records, unlisted = gather_records(root, ann_path)
    kept = [r for r in records if cfg.labels == "original" or r.agreed]
    dropped = [r for r in records if cfg.labels == "agreed" and not r.agreed]
    if not kept:
        raise CapsmedError(f"{ann_path}: no image left with --labels {cfg.labels}")
    labels = np.array([CLASS_NAMES.index(r.label) for r in kept], dtype=np.int64)
    folds = assign_folds(labels, cfg.folds, cfg.seed, ann_path)
    workers = default_workers(cfg.workers)
    log.info("%d images (%d dropped by --labels %s), %d folds, %d worker(s)", len(kept),
             len(dropped), cfg.labels, cfg.folds, workers)

    parameters: dict[str, object] = {
        k: v for k, v in asdict(cfg).items() if k not in ("workers", "chunk_size")}
    parameters.update(
        class_full_names=list(CLASSES.values()), class_order="paper 001 Table 2",
        rgba_to_rgb="composite over white per TIFF ExtraSamples; unspecified extra "
                    "sample dropped",
        resize="cv2.INTER_AREA to size x size (non-square sources are stretched)",
        grey_conversion="cv2 RGB2GRAY after resizing" if cfg.grey else "none",
        folds_method="sklearn StratifiedKFold(shuffle=True, random_state=seed)",
        group_unit="image (the release has no patient ids)",
        images=len(kept), dropped_by_labels=len(dropped),
        dropped_examples=[r.relpath for r in dropped[:_SHOWN]],
        unlisted_images=len(unlisted), unlisted_examples=unlisted[:_SHOWN],
        reannotated=sum(r.reannotations != (NOT_REANNOTATED,) * 2 for r in records))
    sizes = {r.relpath: (root / r.relpath).stat().st_size for r in kept}
    source = {"raw_dir": str(raw_dir.resolve()), "image_root": str(root.resolve()),
              "annotations": str(ann_path.resolve()),
              "annotations_sha256": hashlib.sha256(ann_path.read_bytes()).hexdigest(),
              "files": sizes}
    channels = 1 if cfg.grey else 3
    chunks = [_Chunk(root, tuple(r.relpath for r in kept[i:i + cfg.chunk_size]), cfg.size,
                     cfg.grey) for i in range(0, len(kept), cfg.chunk_size)]
    writer = DatasetWriter(output, dataset="aml", kind=SOURCE.name,
                           domain=SOURCE.domain, class_names=CLASS_NAMES,
                           image_shape=(channels, cfg.size, cfg.size),
                           preprocessing=parameters, source=source)
    shapes, translucent, start = [], 0, 0
    cache = ResultCache(output, {"parameters": parameters, "source": source,
                                 "chunk_size": cfg.chunk_size})
    with cache, writer:
        for chunk, res in map_in_workers(process_chunk, chunks, workers=workers,
                                         description="AML images",
                                         disable_progress=disable_progress, cache=cache,
                                         key=lambda c: "|".join(c.relpaths),
                                         inputs=_chunk_inputs, result_type=_ChunkResult):
            batch = kept[start:start + len(chunk.relpaths)]
            end = start + len(batch)
            writer.append("all", res.images, labels[start:end], [r.image_id for r in batch],
                          meta={"source": np.array([r.relpath for r in batch]),
                                "reannotation_1": np.array([r.reannotations[0] for r in batch]),
                                "reannotation_2": np.array([r.reannotations[1] for r in batch]),
                                "source_hw": res.shapes},
                          folds=folds[start:end])
            shapes.append(res.shapes)
            translucent += int(res.translucent.sum())
            start = end
        # Source sizes are known only once every image was read; the record is written
        # when the writer closes.
        writer.update_preprocessing(source_size=_size_summary(np.concatenate(shapes)),
                                    images_with_transparency=translucent)
    return output
