"""A dataset file that breaks the contract is refused when it is opened, by every
command, with one line naming the file, before anything is written: labels outside
the classes, other dtypes or shapes, malformed JSON attributes, a damaged body."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from tests.faults.common import assert_refused, invoke, lenet_args


def _set_labels(split, index, value):
    def change(path):
        with h5py.File(path, "r+") as f:
            f[f"{split}/labels"][index] = value
    return change


def _replace(name, make):
    def change(path):
        with h5py.File(path, "r+") as f:
            values = make(f[name][...])
            del f[name]
            f.create_dataset(name, data=values)
    return change


def _attribute(name, value):
    def change(path):
        with h5py.File(path, "r+") as f:
            f.attrs[name] = value
    return change


def _overwrite(find, size=64):
    """Overwrite ``size`` bytes at the offset ``find(file)`` returns (a damaged disk)."""
    def change(path):
        with h5py.File(path, "r") as f:
            offset = find(f)
        with open(path, "r+b") as fh:
            fh.seek(offset)
            fh.write(b"\x13" * size)
    return change


def _first_image_chunk(f):
    return f["train/images"].id.get_chunk_info(0).byte_offset + 10


def _groups_header(f):
    return h5py.h5o.get_info(f["train/groups"].id).addr


def _split_class_names_reversed(path):
    """The test split's labels name the classes in the other order: a reader of the
    split's attribute (docs/interop.md's h5py example) would swap every label."""
    with h5py.File(path, "r+") as f:
        names = json.loads(f.attrs["class_names"])
        f["test/labels"].attrs["class_names"] = json.dumps(names[::-1])


def _rename(old, new):
    """A split whose dataset another tool named otherwise: the split is not to be
    passed over as if the file had none (a run without its validation set)."""
    def change(path):
        with h5py.File(path, "r+") as f:
            f.move(old, new)
    return change


def _second_labels_of_twice_the_rows(path):
    """meta/label2 with a row per image and as many again: the run took the first rows,
    so the second digit of each image came from another row."""
    with h5py.File(path, "r+") as f:
        n = f["train/labels"].shape[0]
        f["train/meta/label2"] = (np.arange(2 * n) + 1) % 2


def _dataset_attribute(name, key, value):
    def change(path):
        with h5py.File(path, "r+") as f:
            f[name].attrs[key] = value
    return change


def _binary_images(path):
    """uint8 images of 0 and 1 that say so (another tool's masks): read as 0..255 they
    would train on black images."""
    with h5py.File(path, "r+") as f:
        images = f["train/images"]
        images[...] = images[...] > 100
        images.attrs["value_range"] = np.array([0, 1], np.uint8)


def _truncate(path):
    path.write_bytes(path.read_bytes()[:3000])


FAULTS = {  # id: (change, text of the error line)
    "label-7-of-2-classes": (_set_labels("train", 3, 7), "outside 0..1 (e.g. 7)"),
    "label-minus-1": (_set_labels("val", 0, -1), "outside 0..1 (e.g. -1)"),
    "float32-images": (_replace("train/images", lambda v: v.astype(np.float32) / 255),
                       "'train/images' is float32"),
    "three-channel-images": (_replace("test/images", lambda v: np.repeat(v, 3, axis=1)),
                             "expected uint8 [N, 1, 28, 28]"),
    "float-labels": (_replace("train/labels", lambda v: v.astype(np.float64)),
                     "'train/labels' is float64"),
    "integer-groups": (_replace("train/groups", lambda v: np.arange(len(v))),
                       "'train/groups' is int64"),
    "class-names-not-json": (_attribute("class_names", "['dark', 'bright'"),
                             "attribute 'class_names' must be JSON"),
    "class-names-an-object": (_attribute("class_names", json.dumps({"a": 1})),
                              "attribute 'class_names' must be JSON"),
    "class-names-repeated": (_attribute("class_names", json.dumps(["a", "a"])),
                             "distinct class names"),
    "image-size-not-json": (_attribute("image_size", "28x28"),
                            "attribute 'image_size' must be JSON"),
    "image-size-one-number": (_attribute("image_size", "[28]"), "two positive integers"),
    "channels-a-string": (_attribute("channels", "one"), "'channels' must be an integer"),
    "preprocessing-not-json": (_attribute("preprocessing", "{seed: 0"),
                               "attribute 'preprocessing' must be JSON"),
    "split-class-names-reversed": (_split_class_names_reversed,
                                   "'test/labels' names its classes"),
    "val-labels-named-label": (_rename("val/labels", "val/label"),
                               "split 'val' has no 'labels' dataset"),
    "meta-longer-than-split": (_second_labels_of_twice_the_rows,
                               "'train/meta/label2' has 96 rows for 48 samples"),
    "images-in-0-1": (_binary_images, "'train/images' has value_range [0, 1]"),
    "images-channels-last": (_dataset_attribute("val/images", "axes", "N,H,W,C"),
                             "'val/images' has axes 'N,H,W,C'"),
    "damaged-object-header": (_overwrite(_groups_header), "cannot read"),
    "truncated": (_truncate, "cannot open HDF5 file"),
}
# A damaged image chunk is only seen when images are read: not by `data info`.
IMAGE_FAULTS = {"damaged-image-chunk": (_overwrite(_first_image_chunk), "cannot read")}


def _commands(data, tmp_path):
    return {"data info": (["data", "info", data], []),
            "data preview": (["data", "preview", data, "-o", tmp_path / "grid.png"],
                             [tmp_path / "grid.png"]),
            "train": (lenet_args(data, tmp_path / "run"), [tmp_path / "run"])}


@pytest.mark.parametrize("command", ["data info", "data preview", "train"])
@pytest.mark.parametrize("fault", FAULTS, ids=list(FAULTS))
def test_a_broken_dataset_is_refused_when_opened(toy_copy, tmp_path, fault, command):
    change, text = FAULTS[fault]
    change(toy_copy)
    args, outputs = _commands(toy_copy, tmp_path)[command]
    assert_refused(invoke(args), toy_copy, text=text, absent=outputs)


@pytest.mark.parametrize("fault", IMAGE_FAULTS, ids=list(IMAGE_FAULTS))
def test_a_damaged_image_is_refused_when_read(toy_copy, toy_run, tmp_path, fault):
    change, text = IMAGE_FAULTS[fault]
    change(toy_copy)
    args, outputs = _commands(toy_copy, tmp_path)["train"]
    assert_refused(invoke(args), toy_copy, text=text, absent=outputs)
    # evaluating on it: the test split is intact, the train split is not read
    ok = invoke(["evaluate", toy_run, "--data", toy_copy, "--report-name", "other",
                 "--no-grids"])
    assert ok.exit_code == 0, ok.output
    preview = tmp_path / "grid.png"
    assert_refused(invoke(["data", "preview", toy_copy, "-o", preview, "--split", "train"]),
                   toy_copy, text=text, absent=[preview])
    for workers in ("0", "1"):  # streamed from the file, in the process or a reader
        out = tmp_path / f"streamed{workers}"
        args = [*lenet_args(toy_copy, out), "--data-loading", "stream",
                "--loader-workers", workers]
        assert_refused(invoke(args), toy_copy, text=text, absent=[out])


def test_a_second_label_outside_the_classes_is_refused(tmp_path):
    """Two-object sets (MultiMNIST) carry a second label per image in meta/label2."""
    from capsmed.data.contract import DatasetWriter

    data = tmp_path / "two.h5"
    rng = np.random.default_rng(0)
    with DatasetWriter(data, dataset="toy-two", kind="folder", domain="generic",
                       class_names=["a", "b", "c"],
                       image_shape=(1, 28, 28), preprocessing={}, source={}) as writer:
        for split, n in (("train", 24), ("val", 8)):
            labels = np.arange(n) % 3
            second = (labels + 1) % 3
            if split == "train":
                second[5] = 7
            writer.append(split, rng.integers(0, 255, (n, 1, 28, 28), dtype=np.uint8),
                          labels, [f"{split}{i}" for i in range(n)],
                          meta={"label2": second})
    run = tmp_path / "run"
    assert_refused(invoke(lenet_args(data, run)), data, absent=[run],
                   text="'train/meta/label2' must hold one label within 0..2")
