"""affNIST MATLAB files -> HDF5 contract (a test-only set for paper 004's benchmark).

affNIST (Tieleman 2013) is MNIST padded to 40x40 and warped by random affine maps.
It ships as MATLAB v5 ``.mat`` files: one whole file (``test.mat``) or a folder of
batches (``test_batches/1.mat`` .. ``32.mat``). Each holds a struct ``affNISTdata``
with (among others)

* ``image``: uint8 1600 x N, one image per column;
* ``label_int``: uint8 1 x N, the digit 0-9.

Orientation: each column holds the image's 40 rows one after another (row-major, as
in MNIST's IDX files). MATLAB's column-major ``reshape(image(:, n), 40, 40)`` therefore
shows the digit transposed and needs a ``'``; capsmed reshapes each column row-major,
which is upright (public Python loaders do the same: ``image.T.reshape(-1, 40, 40)``).

Files re-saved as MATLAB v7.3 (HDF5 inside) are read with h5py, where MATLAB's
column-major arrays appear with reversed dimensions (``image`` is N x 1600).
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict
from pathlib import Path

import h5py
import numpy as np

from capsmed.data.contract import DatasetWriter
from capsmed.data.files import FolderWalk, refuse_same_stem
from capsmed.data.output import claims_output
from capsmed.data.sources.mnist import AFFNIST
from capsmed.data.sources.mnist.config import AffnistConfig
from capsmed.data.sources.mnist.reader import MNIST_CLASSES
from capsmed.errors import CapsmedError
from capsmed.progress import track

log = logging.getLogger(__name__)

SIZE = 40
STRUCT = "affNISTdata"
CHUNK = 8192


def _natural_key(path: Path) -> tuple:
    """``2.mat`` before ``10.mat``."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name))


def find_mat_files(path: Path) -> list[Path]:
    """``[path]`` for a file, or the folder's ``*.mat`` batches in numeric order (the
    shared rules of :mod:`capsmed.data.files`: ``3.MAT`` counts, ``.1.mat`` does not).

    Raises:
        CapsmedError: no such path, no ``.mat`` file, or a folder whose files are not
            ``1.mat`` to ``N.mat`` (one whole file alone in a folder is read as it is).
    """
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CapsmedError(f"{path}: no such file or folder (expected affNIST test.mat or a "
                           "folder of batches such as test_batches/)")
    files = sorted(refuse_same_stem(FolderWalk().files(path, (".mat",), recursive=False)),
                   key=_natural_key)
    if not files:
        raise CapsmedError(f"{path}: no .mat files (expected affNIST batches 1.mat, 2.mat, ...)")
    numbered = [Path(f.name).stem.isdecimal() for f in files]
    if len(files) == 1 and not numbered[0]:  # one whole file, e.g. test.mat
        return files
    # else the folder is read as one set's batches: an unpacked training.mat,
    # validation.mat or test.mat beside them would be stored in the one split too (or
    # twice, for test.mat beside its batches)
    other = next((f for f, ok in zip(files, numbered, strict=True) if not ok), None)
    if other is not None:
        raise CapsmedError(f"{other}: not a numbered affNIST batch; a folder must hold only "
                           "one set's batches (1.mat, 2.mat, ...): give a whole file such "
                           "as test.mat itself")
    numbers = [int(Path(f.name).stem) for f in files]
    if numbers != list(range(1, len(files) + 1)):  # a batch missing, or 01.mat and 1.mat
        raise CapsmedError(f"{path}: the batches are not 1.mat to {len(files)}.mat (found "
                           f"{', '.join(f.name for f in files)})")
    return files


# affNIST's sets as the official files and folders name them (training.mat,
# test_batches/, just_centered/validation.mat ...): the split each belongs in
NAMED_SETS = {"training": "train", "training_and_validation": "train",
              "validation": "val", "test": "test"}


def named_set(path: Path) -> str | None:
    """The affNIST set a file's name (or a batch's folder name) says it holds, if any."""
    name = path.parent.name if Path(path.name).stem.isdecimal() else Path(path.name).stem
    name = name.lower().removesuffix("_batches")
    return name if name in NAMED_SETS else None


def refuse_other_set(files: list[Path], split: str) -> None:
    """Refuse files named as another affNIST set than ``split``: training_batches/ stored
    as the default split ``test`` scores a model on MNIST training digits."""
    for f in files:
        named = named_set(f)
        if named is not None and NAMED_SETS[named] != split:
            raise CapsmedError(f"{f}: affNIST's {named} set, but the split is {split!r} "
                               f"(pass --split {NAMED_SETS[named]})")


def _check(path: Path, image: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate the [1600, N] image matrix and N labels; return upright images, labels."""
    if image.ndim != 2 or image.shape[0] != SIZE * SIZE:
        raise CapsmedError(f"{path}: {STRUCT}.image is {'x'.join(map(str, image.shape))}, "
                           f"expected {SIZE * SIZE} x N (one 40x40 image per column)")
    n = image.shape[1]
    labels = np.asarray(labels).reshape(-1)
    if len(labels) != n:
        raise CapsmedError(f"{path}: {len(labels)} labels in {STRUCT}.label_int for {n} "
                           "images")
    if image.dtype != np.uint8:
        if image.dtype.kind not in "iu" or (n and (image.min() < 0 or image.max() > 255)):
            raise CapsmedError(f"{path}: {STRUCT}.image is {image.dtype}, expected uint8")
        image = image.astype(np.uint8)
    if n and (labels.min() < 0 or labels.max() > 9 or (labels != np.round(labels)).any()):
        raise CapsmedError(f"{path}: {STRUCT}.label_int holds values outside 0..9")
    # Column k lists image k's rows in order: transpose to [N, 1600], then row-major.
    return np.ascontiguousarray(image.T).reshape(n, SIZE, SIZE), labels.astype(np.int64)


def _read_v73(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with h5py.File(path, "r") as f:
            if STRUCT not in f:
                raise CapsmedError(f"{path}: no '{STRUCT}' struct (found: "
                                   f"{', '.join(f) or 'nothing'})")
            struct = f[STRUCT]
            for name in ("image", "label_int"):
                if name not in struct:
                    raise CapsmedError(f"{path}: {STRUCT} has no field '{name}'")
            # h5py sees MATLAB's column-major arrays transposed; undo it.
            image, labels = struct["image"][...].T, struct["label_int"][...].T
    except OSError as exc:
        raise CapsmedError(f"{path}: cannot read MATLAB v7.3 file ({exc})") from exc
    return _check(path, image, labels)


def read_affnist_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one affNIST ``.mat`` file: upright images uint8 [N, 40, 40], labels int64 [N].

    Raises:
        CapsmedError: unreadable file, no ``affNISTdata`` struct, or wrong shapes.
    """
    import scipy.io

    path = Path(path)
    if h5py.is_hdf5(path):
        return _read_v73(path)
    try:
        mat = scipy.io.loadmat(path, variable_names=[STRUCT])
    except Exception as exc:  # scipy raises ValueError, TypeError, OSError... on bad files
        raise CapsmedError(f"{path}: cannot read MATLAB file ({type(exc).__name__}: "
                           f"{exc})") from exc
    if STRUCT not in mat:
        found = [name for name, _, _ in scipy.io.whosmat(path)]  # headers only: cheap
        raise CapsmedError(f"{path}: no '{STRUCT}' struct (found: "
                           f"{', '.join(found) or 'nothing'})")
    struct = mat[STRUCT]
    names = struct.dtype.names or ()
    for name in ("image", "label_int"):
        if name not in names:
            raise CapsmedError(f"{path}: {STRUCT} has no field '{name}' (has: "
                               f"{', '.join(names) or 'none'})")
    return _check(path, np.asarray(struct["image"][0, 0]), struct["label_int"][0, 0])


@claims_output
def preprocess_affnist(path: Path, output: Path, config: AffnistConfig | None = None,
                       disable_progress: bool | None = None, overwrite: bool = False
                       ) -> Path:
    """Turn affNIST ``.mat`` file(s) into one HDF5 dataset file (atomically).

    Args:
        path: ``test.mat`` (or any single affNIST file) or a folder of batches.
        output: The ``.h5`` file to write.
        config: Split name and an optional image limit.
        disable_progress: Hide the progress bar.
        overwrite: Replace ``output`` if it exists (otherwise that is an error).

    Returns:
        ``output``.
    """
    cfg = config or AffnistConfig()
    path, output = Path(path), Path(output)
    files = find_mat_files(path)
    refuse_other_set(files, cfg.split)
    root = path if path.is_dir() else path.parent
    parameters = {**asdict(cfg), "image_size": [SIZE, SIZE],
                  "orientation": "each 1600-column reshaped row-major (upright)",
                  "groups": "one per image: affnist-<file>-<index>"}
    source = {"raw_dir": str(root.resolve()),
              "files": {str(f.relative_to(root)): f.stat().st_size for f in files}}
    left = cfg.max_images
    writer = DatasetWriter(output, dataset="affnist", kind=AFFNIST.name,
                           domain=AFFNIST.domain, class_names=MNIST_CLASSES,
                           image_shape=(1, SIZE, SIZE), preprocessing=parameters,
                           source=source)
    with writer:
        for mat in track(files, "affNIST files", disable=disable_progress):
            images, labels = read_affnist_mat(mat)
            if left is not None:
                images, labels = images[:left], labels[:left]
                left -= len(labels)
            name = str(mat.relative_to(root))
            stem = mat.relative_to(root).with_suffix("").as_posix()
            for start in range(0, len(labels), CHUNK):
                index = np.arange(start, min(start + CHUNK, len(labels)), dtype=np.int32)
                writer.append(cfg.split, images[index][:, None], labels[index],
                              np.char.mod(f"affnist-{stem}-%06d", index),
                              meta={"source": np.full(len(index), name), "index": index})
            if left == 0:
                break
    return output
