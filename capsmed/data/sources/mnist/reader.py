"""MNIST and Fashion-MNIST IDX files -> HDF5 contract, optionally placed on a 40x40 canvas.

Expected files in ``raw_dir`` (gzipped as downloaded, or unpacked)::

    train-images-idx3-ubyte[.gz]  train-labels-idx1-ubyte[.gz]
    t10k-images-idx3-ubyte[.gz]   t10k-labels-idx1-ubyte[.gz]

(``train-images.idx3-ubyte``-style names are found too, and in a torchvision root the
dataset's own ``MNIST/raw/`` or ``FashionMNIST/raw/``; the other dataset's published
files are refused by checksum.) The 60,000 training images are split
into train and a seeded validation sample; the 10,000 ``t10k`` images are the test
split. MNIST has no patients, so every image is its own group (``train-000123`` =
image 123 of the training file), which makes the split leak-free by construction.

``placement="random40"`` is paper 004's training set for the affNIST benchmark: each
28x28 image is put at a random position on a black 40x40 canvas, with no other
transform ("center40" pads by 6 px, like affNIST's untransformed digits).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from capsmed.data.contract import DatasetWriter
from capsmed.data.fetch import RemoteDataset, file_md5
from capsmed.data.output import claims_output
from capsmed.data.sources import get_source
from capsmed.data.sources.mnist.config import MnistConfig
from capsmed.data.sources.mnist.idx import read_idx_images, read_idx_labels
from capsmed.errors import CapsmedError, shell_quoted
from capsmed.progress import track

log = logging.getLogger(__name__)

# {file prefix: (images file, labels file)}, without the .gz suffix.
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "t10k": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MNIST_CLASSES = tuple(str(d) for d in range(10))
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                   "Sneaker", "Bag", "Ankle boot")
CLASS_NAMES = {"mnist": MNIST_CLASSES, "fashion-mnist": FASHION_CLASSES}

# Published MD5s of the .gz files (as listed by torchvision and the datasets' pages).
REMOTE = {
    "mnist": RemoteDataset(
        name="mnist",
        mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/",
                 "https://storage.googleapis.com/cvdf-datasets/mnist/",
                 "http://yann.lecun.com/exdb/mnist/"),
        md5={"train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
             "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
             "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
             "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c"},
        homepage="http://yann.lecun.com/exdb/mnist/"),
    "fashion-mnist": RemoteDataset(
        name="fashion-mnist",
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
                 "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/"
                 "data/fashion/"),
        md5={"train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
             "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
             "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
             "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"},
        homepage="https://github.com/zalandoresearch/fashion-mnist"),
}

PUBLISHED_COUNTS = {"train": 60_000, "t10k": 10_000}  # images per file, both datasets
# images per class of the published files: what tells unpacked files of one dataset
# given as the other (they have no published checksum, and the same counts per file)
PUBLISHED_CLASS_COUNTS = {
    "mnist": {"train": (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949),
              "t10k": (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009)},
    "fashion-mnist": {"train": (6000,) * 10, "t10k": (1000,) * 10},
}
CANVAS = 40
CHUNK = 16384  # images per write: bounded memory, few appends (each checks for leaks)
SPLIT_CODES = {"train": 0, "val": 1, "test": 2}  # seeds per split stream


@dataclass(frozen=True)
class SourceSplit:
    """One split of source images: uint8 [N, H, W], int64 labels, per-image ids."""

    images: np.ndarray
    labels: np.ndarray
    ids: np.ndarray  # str [N], e.g. "train-000123": file prefix + index in that file
    index: np.ndarray  # int32 [N], index in the source file

    def __len__(self) -> int:
        return len(self.labels)


TORCHVISION_FOLDER = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}


def _candidates(name: str) -> list[str]:
    dotted = name.replace("-idx", ".idx")  # "train-images.idx3-ubyte" (unpacked by some tools)
    return [f"{name}.gz", name, f"{dotted}.gz", dotted]


def find_idx_files(raw_dir: Path, dataset: str = "mnist") -> dict[str, tuple[Path, Path]]:
    """Locate the four IDX files: ``{"train": (images, labels), "t10k": (images, labels)}``.

    Raises:
        CapsmedError: ``raw_dir`` is missing or lacks some of the files.
    """
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise CapsmedError(f"{raw_dir}: no such folder (expected the {dataset} IDX files; "
                           f"`capsmed fetch {dataset} {shell_quoted(raw_dir)}` downloads them)")
    # torchvision's root holds MNIST/raw and FashionMNIST/raw side by side: only this
    # dataset's own folder is looked in (the files have the same names in both)
    folders = [raw_dir, raw_dir / "raw", raw_dir / TORCHVISION_FOLDER.get(dataset, "MNIST") / "raw"]
    missing: list[str] = []
    for folder in folders:
        found: dict[str, Path] = {}
        for name in (n for pair in IDX_FILES.values() for n in pair):
            hit = next((folder / c for c in _candidates(name) if (folder / c).is_file()), None)
            if hit is not None:
                found[name] = hit
        if len(found) == 4:
            return {prefix: (found[i], found[lab]) for prefix, (i, lab) in IDX_FILES.items()}
        if folder == raw_dir:
            missing = [f"{n}[.gz]" for pair in IDX_FILES.values() for n in pair
                       if n not in found]
    raise CapsmedError(f"{raw_dir}: missing {', '.join(missing)} (the four {dataset} IDX "
                       f"files; `capsmed fetch {dataset} {shell_quoted(raw_dir)}` downloads them)")


def read_idx_pair(images_path: Path, labels_path: Path,
                  num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Read matching image and label files; counts and label range are checked."""
    images = read_idx_images(images_path)
    labels = read_idx_labels(labels_path)
    if len(images) != len(labels):
        raise CapsmedError(f"{labels_path}: {len(labels):,} labels but {images_path.name} "
                           f"holds {len(images):,} images")
    if len(labels) and labels.max() >= num_classes:
        raise CapsmedError(f"{labels_path}: label {int(labels.max())} outside 0..{num_classes - 1}")
    return images, labels.astype(np.int64)


def validation_count(n: int, val: float) -> int:
    """``val`` as a number of images out of ``n`` (a count if >= 1, else a fraction)."""
    count = int(val) if val >= 1 else round(val * n)
    if not 0 <= count < n:
        raise CapsmedError(f"validation size {val} leaves no training images out of {n:,}")
    return count


def split_train_val(n: int, val: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random train/val split of ``n`` images; both index arrays sorted."""
    count = validation_count(n, val)
    chosen = np.random.default_rng([seed, 0]).permutation(n)[:count]
    is_val = np.zeros(n, bool)
    is_val[chosen] = True
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def image_ids(prefix: str, index: np.ndarray) -> np.ndarray:
    """``"train-000123"``-style ids for images ``index`` of the file ``prefix``."""
    return np.char.mod(f"{prefix}-%06d", np.asarray(index))


def _refuse_misplaced_published_files(files: dict[str, tuple[Path, Path]],
                                     md5: dict[str, str], raw_dir: Path, dataset: str) -> None:
    """Refuse a published file found in another file's place: the other dataset's files
    (MNIST given as Fashion-MNIST, or back), or a t10k file named as a train file (a
    swap would make the 10,000 test images the training set, silently)."""
    published = {digest: (other, name) for other, remote in REMOTE.items()
                 for name, digest in remote.md5.items()}
    for prefix, pair in files.items():
        for expected, path in zip(IDX_FILES[prefix], pair, strict=True):
            other, name = published.get(md5[str(path.relative_to(raw_dir))], (dataset, None))
            if other != dataset:
                raise CapsmedError(f"{path}: this is the published {other} file, not "
                                   f"{dataset}; point `capsmed preprocess {dataset}` at the "
                                   f"{dataset} files")
            if name is not None and name != f"{expected}.gz":
                raise CapsmedError(f"{path}: this is the published {dataset} file {name}, "
                                   f"not {expected}.gz (train and t10k files swapped?)")


def _refuse_other_datasets_labels(files: dict[str, tuple[Path, Path]],
                                  labels: dict[str, np.ndarray], dataset: str) -> None:
    """Refuse files whose labels count, class by class, as the other dataset's published
    files: unpacked Fashion-MNIST given as MNIST (or back) has the same shapes and file
    names, and would be preprocessed under the wrong class names without a word."""
    counts = {prefix: tuple(int(c) for c in np.bincount(labels[prefix], minlength=10))
              for prefix in labels}
    for other, published in PUBLISHED_CLASS_COUNTS.items():
        if other != dataset and counts == published:
            raise CapsmedError(f"{files['train'][1]}: its labels count per class as the "
                               f"published {other} files, not {dataset}; point `capsmed "
                               f"preprocess {other}` at them, or give the {dataset} files")


def load_mnist_splits(raw_dir: Path, dataset: str, val: float, seed: int
                      ) -> tuple[dict[str, SourceSplit], dict]:
    """Read the IDX files of ``raw_dir`` as train / val / test source splits.

    Returns:
        ``({split: SourceSplit}, source)`` where ``source`` records the raw folder, each
        file's size and MD5, and whether all four are the published files.
    """
    raw_dir = Path(raw_dir)
    files = find_idx_files(raw_dir, dataset)
    paths = [p for pair in files.values() for p in pair]
    md5 = {str(p.relative_to(raw_dir)): file_md5(p) for p in paths}
    official = REMOTE[dataset].md5 if dataset in REMOTE else {}
    _refuse_misplaced_published_files(files, md5, raw_dir, dataset)
    train_images, train_labels = read_idx_pair(*files["train"])
    test_images, test_labels = read_idx_pair(*files["t10k"])
    if train_images.shape[1:] != test_images.shape[1:]:
        raise CapsmedError(f"{files['t10k'][0]}: images are {test_images.shape[1:]} but the "
                           f"training images are {train_images.shape[1:]}")
    if (len(train_labels), len(test_labels)) == (PUBLISHED_COUNTS["t10k"],
                                                 PUBLISHED_COUNTS["train"]):
        # unpacked files have no published checksum to tell them by: their counts do
        raise CapsmedError(f"{files['train'][0]}: holds {len(train_labels):,} images and "
                           f"{files['t10k'][0].name} {len(test_labels):,}: the train and "
                           "t10k files swapped (the published train files hold 60,000)")
    if train_images.shape == test_images.shape and np.array_equal(train_images, test_images):
        # a copy of one file under the other's name: the test split would be the training
        # images (unpacked files have no checksum to tell them by)
        raise CapsmedError(f"{files['t10k'][0]}: holds the same images as "
                           f"{files['train'][0].name}: the test split would be the training "
                           "images")
    _refuse_other_datasets_labels(files, {"train": train_labels, "t10k": test_labels},
                                  dataset)
    train_idx, val_idx = split_train_val(len(train_labels), val, seed)
    test_idx = np.arange(len(test_labels))
    splits = {}
    for split, prefix, images, labels, idx in (
            ("train", "train", train_images, train_labels, train_idx),
            ("val", "train", train_images, train_labels, val_idx),
            ("test", "t10k", test_images, test_labels, test_idx)):
        if len(idx):
            splits[split] = SourceSplit(images[idx], labels[idx], image_ids(prefix, idx),
                                        idx.astype(np.int32))
    source = {"raw_dir": str(Path(raw_dir).resolve()),
              "files": {str(p.relative_to(raw_dir)): p.stat().st_size for p in paths},
              "md5": md5,
              "official_files": all(official.get(p.name) == md5[k]
                                    for p, k in zip(paths, md5, strict=True))}
    return splits, source


def place_on_canvas(images: np.ndarray, offsets: np.ndarray, canvas: int) -> np.ndarray:
    """Paste each image [N, h, w] onto a black ``canvas`` square at its (top, left) offset.

    Images are grouped by offset and each group is pasted with one slice assignment,
    so the Python loop runs over distinct offsets (at most 13 x 13 on 40x40), not images.
    """
    n, h, w = images.shape
    offsets = np.asarray(offsets, np.int64).reshape(n, 2)
    if n and (offsets.min() < 0 or (offsets + [h, w]).max() > canvas):
        raise ValueError(f"offsets put a {h}x{w} image outside the {canvas}x{canvas} canvas")
    out = np.zeros((n, canvas, canvas), images.dtype)
    keys = offsets[:, 0] * (canvas + 1) + offsets[:, 1]
    order = np.argsort(keys, kind="stable")
    _, starts = np.unique(keys[order], return_index=True)
    for same in np.split(order, starts[1:]):
        if len(same):
            y, x = offsets[same[0]]
            out[same, y:y + h, x:x + w] = images[same]
    return out


def _offsets(cfg: MnistConfig, split: str, n: int, size: tuple[int, int]) -> np.ndarray | None:
    if cfg.placement == "none":
        return None
    room = np.array([CANVAS - size[0], CANVAS - size[1]])
    if (room < 0).any():
        raise CapsmedError(f"{size[0]}x{size[1]} images do not fit a {CANVAS}x{CANVAS} canvas")
    if cfg.placement == "center40":
        return np.tile(room // 2, (n, 1))
    rng = np.random.default_rng([cfg.seed, 1, SPLIT_CODES[split]])
    return rng.integers(0, room + 1, size=(n, 2))  # every top-left corner equally likely


@claims_output
def preprocess_mnist(raw_dir: Path, output: Path, config: MnistConfig | None = None,
                     disable_progress: bool | None = None, overwrite: bool = False
                     ) -> Path:
    """Turn MNIST or Fashion-MNIST IDX files into one HDF5 dataset file (atomically).

    Args:
        raw_dir: Folder with the four IDX files (``.gz`` or plain).
        output: The ``.h5`` file to write.
        config: Dataset, validation size, placement and seed.
        disable_progress: Hide the progress bar.
        overwrite: Replace ``output`` if it exists (otherwise that is an error).

    Returns:
        ``output``.
    """
    cfg = config or MnistConfig()
    splits, source = load_mnist_splits(raw_dir, cfg.dataset, cfg.val, cfg.seed)
    size = next(iter(splits.values())).images.shape[1:]
    out_size = size if cfg.placement == "none" else (CANVAS, CANVAS)
    parameters = {**asdict(cfg), "val_count": len(splits["val"]) if "val" in splits else 0,
                  "image_size": list(out_size), "source_image_size": list(size),
                  "canvas": None if cfg.placement == "none" else CANVAS,
                  "split_sources": {"train": "train-* file minus val", "val": "seeded "
                                    "sample of the train-* file", "test": "t10k-* file"},
                  "groups": "one per image (MNIST has no patients): <file>-<index>"}
    offsets = {s: _offsets(cfg, s, len(d.labels), size) for s, d in splits.items()}
    jobs = [(s, start) for s, d in splits.items() for start in range(0, len(d.labels), CHUNK)]
    writer = DatasetWriter(output, dataset=cfg.dataset, kind=cfg.dataset,
                           domain=get_source(cfg.dataset).domain,
                           class_names=CLASS_NAMES[cfg.dataset], image_shape=(1, *out_size),
                           preprocessing=parameters, source=source)
    with writer:
        for split, start in track(jobs, f"Writing {cfg.dataset}", disable=disable_progress):
            data, stop = splits[split], start + CHUNK
            images = data.images[start:stop]
            meta = {"index": data.index[start:stop]}
            if offsets[split] is not None:
                where = offsets[split][start:stop]
                images = place_on_canvas(images, where, CANVAS)
                meta.update(offset_y=where[:, 0].astype(np.int16),
                            offset_x=where[:, 1].astype(np.int16))
            writer.append(split, images[:, None], data.labels[start:stop],
                          data.ids[start:stop], meta=meta)
    log.info("%s: %s images from %s", output, cfg.dataset,
             ", ".join(f"{s}={len(d.labels)}" for s, d in splits.items()))
    return Path(output)
