"""TUPAC16 auxiliary mitosis dataset -> HDF5 contract (paper 000's protocol).

Accepted layouts under ``raw_dir``:

* official: ``mitoses_image_data_part_{1,2,3}/<CC>/<NN>.tif`` with
  ``mitoses_ground_truth/<CC>/<NN>.csv``;
* flattened: ``<CC>/<NN>.tif`` with ``<NN>.csv`` beside it (at any depth).

A CSV has no header and one mitosis per line as integer ``row,col``; an image without
a CSV has no mitoses, but a set without any mitosis is refused (a missing or misplaced
``mitoses_ground_truth/`` looks exactly like that) unless ``allow_no_annotations``.
Extensions match in any case and linked case folders are followed
(:mod:`capsmed.data.files`). Each image becomes: hematoxylin channel (colour deconvolution) ->
positives (patches centred on each mitosis plus jittered copies) and negatives (tissue
patches with no mitosis) -> resize. Cases are split, never patches.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from capsmed.data.contract import DatasetWriter
from capsmed.data.files import FolderWalk, check_file, find_in_folder
from capsmed.data.images import read_rgb_tiff
from capsmed.data.normalise import StainNormaliser, build_normaliser
from capsmed.data.output import claims_output
from capsmed.data.patches import extract_patches, resize_patches, window_fraction
from capsmed.data.pool import default_workers, map_in_workers
from capsmed.data.resume import ResultCache
from capsmed.data.sources.tupac16 import SOURCE
from capsmed.data.sources.tupac16.config import Tupac16Config
from capsmed.data.splits import assign_splits, warn_missing_classes
from capsmed.data.stains import hematoxylin_channel, tissue_mask
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)

CLASS_NAMES = ("non-mitosis", "mitosis")
GROUND_TRUTH_DIR = "mitoses_ground_truth"
TIFF_SUFFIXES = (".tif", ".tiff")


@dataclass(frozen=True)
class ImageRecord:
    """One raw image: its case, id, files and ground-truth mitoses (row, col)."""

    case: str
    image: str
    tif: Path
    csv: Path | None
    mitoses: np.ndarray


MAX_COORDINATE = 1 << 31  # far beyond any image; keeps int64 arithmetic exact


def _coordinate(text: str) -> int:
    value = float(text)  # ValueError for text; "1e400" is inf
    if not math.isfinite(value) or abs(value) >= MAX_COORDINATE or value != int(value):
        raise ValueError  # "60.9" too: truncating it would move the mitosis
    return int(value)


def read_mitosis_csv(path: Path) -> np.ndarray:
    """Read a TUPAC16 ground-truth CSV (no header, ``row,col`` per line) -> (K, 2) int64."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CapsmedError(f"{path}: cannot read ground-truth CSV ({exc})") from exc
    rows: dict[tuple[int, int], int] = {}  # (row, col) -> its line
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        try:
            if len(parts) != 2:
                raise ValueError
            point = (_coordinate(parts[0]), _coordinate(parts[1]))
        except ValueError:
            raise CapsmedError(f"{path}: line {number}: expected 'row,col' integers "
                               f"(pixel coordinates), got {line.strip()[:60]!r}") from None
        if point in rows:  # one mitosis listed twice would give twice its positives
            log.warning("%s: line %d: mitosis at row %d, col %d is already listed on line "
                        "%d; counted once", path, number, *point, rows[point])
            continue
        rows[point] = number
    return np.array(list(rows), dtype=np.int64).reshape(-1, 2)


def discover(raw_dir: Path) -> list[ImageRecord]:
    """Find every TUPAC16 image and its ground truth under ``raw_dir`` (either layout)."""
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise CapsmedError(f"{raw_dir}: no such folder (expected the unpacked TUPAC16 "
                           "mitosis data)")
    tifs = FolderWalk().files(raw_dir, TIFF_SUFFIXES, skip=(GROUND_TRUTH_DIR,))
    if not tifs:
        raise CapsmedError(f"{raw_dir}: no TUPAC16 images found (expected "
                           "mitoses_image_data_part_N/<CC>/<NN>.tif or <CC>/<NN>.tif)")
    records: dict[tuple[str, str], ImageRecord] = {}
    for tif in tifs:
        case, image = tif.parent.name, tif.stem
        if (case, image) in records:
            raise CapsmedError(f"{tif}: case {case} image {image} also found at "
                               f"{records[(case, image)].tif}")
        csv, mitoses = _ground_truth(raw_dir, tif)
        records[(case, image)] = ImageRecord(case, image, tif, csv, mitoses)
    _refuse_orphan_csvs(raw_dir, list(records.values()))
    return [records[k] for k in sorted(records)]


def _ground_truth(raw_dir: Path, tif: Path) -> tuple[Path | None, np.ndarray]:
    """An image's ground-truth CSV (in the ground-truth folder or beside the image)
    and its mitoses; two CSVs that disagree are refused, since either could be meant."""
    case, image = tif.parent.name, tif.stem
    found = [p for p in (find_in_folder(raw_dir / GROUND_TRUTH_DIR / case, image, ".csv"),
                         find_in_folder(tif.parent, image, ".csv")) if p is not None]
    if not found:
        return None, np.empty((0, 2), dtype=np.int64)
    tables = [read_mitosis_csv(check_file(p, "ground-truth CSV", allow_empty=True))
              for p in found]
    if len(tables) == 2 and not np.array_equal(tables[0], tables[1]):
        raise CapsmedError(f"{found[1]}: ground truth for case {case} image {image} "
                           f"differs from {found[0]}; keep one of the two")
    return found[0], tables[0]


def _refuse_orphan_csvs(raw_dir: Path, records: list[ImageRecord]) -> None:
    """A ground-truth CSV no image reads (its image missing, or misnamed) would drop
    its mitoses without a word: refuse it, naming the image it expects. Looked at: the
    ground-truth folder, the image folders, and the folders beside them (a case folder
    whose images are all lost; there only CSVs that read as mitoses count)."""
    # an image reads its CSV in the ground-truth folder and an identical one beside it
    beside_image = (find_in_folder(r.tif.parent, r.image, ".csv") for r in records)
    used = {os.path.realpath(p) for p in (*(r.csv for r in records), *beside_image)
            if p is not None}
    beside = {r.tif.parent for r in records}
    folders = [raw_dir / GROUND_TRUTH_DIR] if (raw_dir / GROUND_TRUTH_DIR).is_dir() else []
    csvs = [p for folder in folders for p in FolderWalk().files(folder, (".csv",))]
    csvs += [p for folder in sorted(beside)
             for p in FolderWalk().files(folder, (".csv",), recursive=False)]
    csvs += [p for p in _csvs_beside_case_folders(raw_dir, beside)
             if os.path.realpath(p) not in used and _holds_mitoses(p)]
    for csv in csvs:
        if os.path.realpath(csv) not in used:
            raise CapsmedError(f"{csv}: ground truth for case {csv.parent.name} image "
                               f"{csv.stem}, but no image {csv.parent.name}/{csv.stem}.tif "
                               "was found; its mitoses would be lost (restore or rename "
                               "the image, or remove the CSV)")


def _csvs_beside_case_folders(raw_dir: Path, case_folders: set[Path]) -> list[Path]:
    """The CSVs directly inside the other folders next to the image (case) folders, the
    ground-truth folder aside: where a case folder that lost its images sits."""
    parents = {folder.parent for folder in case_folders if folder != raw_dir}
    others = sorted({entry for parent in parents for entry in parent.iterdir()
                     if entry.is_dir() and not entry.name.startswith(".")
                     and entry.name != GROUND_TRUTH_DIR} - case_folders)
    return [p for folder in others for p in FolderWalk().files(folder, (".csv",),
                                                              recursive=False)]


def _holds_mitoses(path: Path) -> bool:
    """Whether ``path`` reads as a ground-truth CSV with a mitosis (other CSVs, such as a
    list of case ids, are not ground truth)."""
    try:
        return len(read_mitosis_csv(check_file(path, "CSV", allow_empty=True))) > 0
    except CapsmedError:
        return False


def check_annotations(raw_dir: Path, records: list[ImageRecord]) -> None:
    """Refuse a set in which no image has a mitosis: a missing, renamed or misplaced
    ground-truth folder gives exactly that, and a dataset of negatives only."""
    if any(len(r.mitoses) for r in records):
        return
    folder = raw_dir / GROUND_TRUTH_DIR
    found = sum(r.csv is not None for r in records)
    state = (f"{found} ground-truth CSV(s) found, all empty" if found else
             "no ground-truth CSV found" + ("" if folder.is_dir() else " (no such folder)"))
    raise CapsmedError(f"{folder}: {state}; looked for <CC>/<NN>.csv there and <NN>.csv "
                       "beside each image, so the dataset would hold no mitosis (pass "
                       "--allow-no-annotations to write it anyway)")


@dataclass(frozen=True)
class _Job:
    index: int
    record: ImageRecord
    negatives: int
    config: Tupac16Config
    stain: StainNormaliser | None = None


@dataclass
class _Result:
    images: np.ndarray
    labels: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    negatives_short: int


def _sample_negatives(mask: np.ndarray, mitoses: np.ndarray, count: int, cfg: Tupac16Config,
                      rng: np.random.Generator) -> np.ndarray:
    """Tissue patch centres whose patch (plus a margin) contains no mitosis."""
    h, w = mask.shape
    half = cfg.patch_size // 2
    if count == 0 or h < cfg.patch_size or w < cfg.patch_size:
        return np.empty((0, 2), dtype=np.int64)
    chosen: list[np.ndarray] = []
    found = 0
    for _ in range(20):  # rejection sampling in vectorised rounds
        n = max(64, 4 * (count - found))
        cand = np.stack([rng.integers(half, h - (cfg.patch_size - half) + 1, n),
                         rng.integers(half, w - (cfg.patch_size - half) + 1, n)], axis=1)
        ok = window_fraction(mask, cand, cfg.patch_size) >= cfg.min_tissue
        if len(mitoses):
            reach = half + cfg.mitosis_radius
            d = np.abs(cand[:, None, :] - mitoses[None, :, :]).max(axis=-1)
            ok &= (d > reach).all(axis=1)
        good = cand[ok][: count - found]
        chosen.append(good)
        found += len(good)
        if found >= count:
            break
    return np.concatenate(chosen).astype(np.int64)


def process_image(job: _Job) -> _Result:
    """Hematoxylin channel + positive/negative patches for one image (runs in a worker)."""
    cfg, rec = job.config, job.record
    rgb = read_rgb_tiff(rec.tif, "TUPAC16")
    if job.stain is not None:
        rgb = job.stain.apply(rgb)
    h, w = rgb.shape[:2]
    if h < cfg.patch_size or w < cfg.patch_size:
        raise CapsmedError(f"{rec.tif}: image is {w}x{h} px, too small for one "
                           f"{cfg.patch_size}x{cfg.patch_size} patch (TUPAC16 images are "
                           "2000x2000; a truncated export?)")
    for number, (r, c) in enumerate(rec.mitoses, start=1):
        if not (0 <= r < h and 0 <= c < w):
            raise CapsmedError(f"{rec.csv}: line {number}: mitosis at row {r}, col {c} is "
                               f"outside the {h}x{w} image {rec.tif.name}")
    rng = np.random.default_rng([cfg.seed, job.index])
    hema = hematoxylin_channel(rgb, cfg.h_max)

    k = cfg.positives_per_mitosis
    offsets = rng.integers(-cfg.jitter, cfg.jitter + 1, size=(len(rec.mitoses), k, 2))
    offsets[:, 0, :] = 0  # the first copy of every mitosis is exactly centred
    # Near the border a jittered centre can leave the image: clip it back in. The mitosis
    # stays inside the patch because jitter < patch_size / 2 (checked in the config).
    pos = np.clip((rec.mitoses[:, None, :] + offsets).reshape(-1, 2), 0, [h - 1, w - 1])
    neg = _sample_negatives(tissue_mask(rgb), rec.mitoses, job.negatives, cfg, rng)

    centres = np.concatenate([pos, neg]).astype(np.int64)
    patches = resize_patches(extract_patches(hema, centres, cfg.patch_size), cfg.output_size)
    labels = np.concatenate([np.ones(len(pos), np.int64), np.zeros(len(neg), np.int64)])
    return _Result(images=patches[:, None], labels=labels, rows=centres[:, 0].astype(np.int32),
                   cols=centres[:, 1].astype(np.int32),
                   negatives_short=job.negatives - len(neg))


def _inputs(job: _Job) -> list[Path]:
    """The files a job's result depends on: its image and its ground-truth CSV (whose
    mitoses the job carries); a cached result is reused only while both are unchanged."""
    return [job.record.tif, *([job.record.csv] if job.record.csv else [])]


def _assign_splits(records: list[ImageRecord], cfg: Tupac16Config) -> dict[str, str]:
    return assign_splits((r.case for r in records), cfg.split_files, cfg.fractions, cfg.seed,
                         unit="case")


def _negatives_per_image(records: list[ImageRecord], split_of: dict[str, str],
                         cfg: Tupac16Config) -> dict[str, int]:
    """Per split, enough negatives per image to match that split's positives."""
    if cfg.negatives_per_image is not None:
        return {s: cfg.negatives_per_image for s in set(split_of.values())}
    out = {}
    for split in set(split_of.values()):
        in_split = [r for r in records if split_of.get(r.case) == split]
        positives = sum(len(r.mitoses) for r in in_split) * cfg.positives_per_mitosis
        out[split] = max(1, math.ceil(positives / max(1, len(in_split))))
    return out


@claims_output
def preprocess_tupac16(raw_dir: Path, output: Path, config: Tupac16Config | None = None,
                       disable_progress: bool | None = None, overwrite: bool = False
                       ) -> Path:
    """Turn raw TUPAC16 files into one HDF5 dataset file (atomically).

    Args:
        raw_dir: Folder holding the official or flattened layout.
        output: The ``.h5`` file to write.
        config: Processing parameters (defaults: paper 000).
        disable_progress: Hide the progress bar.
        overwrite: Replace ``output`` if it exists (otherwise that is an error).

    Returns:
        ``output``.
    """
    cfg = config or Tupac16Config()
    raw_dir, output = Path(raw_dir), Path(output)
    stain = build_normaliser(cfg.stain_norm, cfg.stain_target)
    records = discover(raw_dir)
    if not cfg.allow_no_annotations:
        check_annotations(raw_dir, records)
    split_of = _assign_splits(records, cfg)
    records = [r for r in records if r.case in split_of]
    negatives = _negatives_per_image(records, split_of, cfg)
    jobs = [_Job(i, r, negatives[split_of[r.case]], cfg, stain)
            for i, r in enumerate(records)]
    workers = default_workers(cfg.workers)
    log.info("%d images from %d cases; %d mitoses; %d worker(s)", len(records),
             len(split_of), sum(len(r.mitoses) for r in records), workers)

    parameters = {k: v for k, v in asdict(cfg).items() if k not in ("workers",)}
    parameters.update(stain="ruifrok-johnston rgb2hed (scikit-image)", channel="hematoxylin",
                      mapping="255*(1-clip(H/h_max,0,1))", resize="cv2.INTER_AREA",
                      split_unit="case", negatives_per_image_used=negatives)
    if stain is not None:
        parameters.update(stain_normalisation=stain.to_record(),
                          stain_norm_unit="each whole image, before deconvolution")
    source = {"raw_dir": str(raw_dir.resolve()),
              "files": {str(r.tif.relative_to(raw_dir)): r.tif.stat().st_size
                        for r in records}}
    short = 0
    labels_by_split: dict[str, set[int]] = {split: set() for split in set(split_of.values())}
    writer = DatasetWriter(output, dataset="tupac16", kind=SOURCE.name,
                           domain=SOURCE.domain, class_names=CLASS_NAMES,
                           image_shape=(1, cfg.output_size, cfg.output_size),
                           preprocessing=parameters, source=source,
                           allow_group_leak=cfg.allow_group_leak)
    cache = ResultCache(output, {"parameters": parameters, "source": source})
    with cache, writer:
        for job, res in map_in_workers(process_image, jobs, workers=workers,
                                       description="TUPAC16 images",
                                       disable_progress=disable_progress, cache=cache,
                                       key=lambda j: f"{j.index}:{j.record.tif}:{j.negatives}",
                                       inputs=_inputs, result_type=_Result):
            rec = job.record
            n = len(res.labels)
            writer.append(split_of[rec.case], res.images, res.labels, [rec.case] * n,
                          meta={"source": np.array([str(rec.tif.relative_to(raw_dir))] * n),
                                "row": res.rows, "col": res.cols})
            short += res.negatives_short
            labels_by_split[split_of[rec.case]].update(res.labels.tolist())
    warn_missing_classes(labels_by_split, CLASS_NAMES)
    if short:
        log.warning("%d negative patches could not be placed (too little tissue away from "
                    "mitoses); classes are slightly less balanced", short)
    return output

