"""MedMNIST: the published .npz layout through the real reader, the published set
table, refusals of bad archives (never unpickling), predict's replay and fetch."""

from __future__ import annotations

import hashlib
import pickle
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import load_split, read_info
from capsmed.data.record import DatasetRecord
from capsmed.data.replay import make_recipe
from capsmed.data.replay.options import Overrides
from capsmed.data.sources.medmnist.config import MedmnistConfig
from capsmed.data.sources.medmnist.reader import preprocess_medmnist, remote
from capsmed.data.sources.medmnist.sets import SETS, SETS_3D
from capsmed.data.sources.medmnist.synth import write_medmnist
from capsmed.errors import CapsmedError
from tests.helpers import assert_clean_failure

runner = CliRunner()


@pytest.fixture(scope="module")
def blood(tmp_path_factory) -> Path:
    return write_medmnist(tmp_path_factory.mktemp("raw"), set_name="bloodmnist", train=40,
                          val=16, test=24, seed=1).path


def _arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def test_the_synthetic_file_has_the_published_layout(blood):
    arrays = _arrays(blood)
    assert blood.name == "bloodmnist.npz"
    assert sorted(arrays) == sorted(f"{s}_{k}" for s in ("train", "val", "test")
                                    for k in ("images", "labels"))
    assert arrays["train_images"].dtype == np.uint8
    assert arrays["train_images"].shape == (40, 28, 28, 3)
    assert arrays["test_labels"].shape == (24, 1)
    assert set(arrays["train_labels"].ravel()) == set(range(8))


def test_preprocess_keeps_the_official_splits_images_and_classes(blood, tmp_path):
    out = preprocess_medmnist(blood, tmp_path / "blood.h5")
    info = read_info(out)
    arrays = _arrays(blood)
    assert info.dataset == "bloodmnist" and info.source_kind == "medmnist"
    assert info.domain == "cytology" and info.image_domain().augment_recipe == "paper001"
    assert info.class_names == SETS["bloodmnist"].classes
    assert info.class_names[3].startswith("immature granulocytes")
    assert info.split_sizes == {"test": 24, "train": 40, "val": 16}
    for split in ("train", "val", "test"):
        data = load_split(out, split, with_meta=True)
        assert np.array_equal(data.images, arrays[f"{split}_images"].transpose(0, 3, 1, 2))
        assert np.array_equal(data.labels, arrays[f"{split}_labels"].ravel())
        assert data.groups[5] == f"{split}-000005"  # one group per image
        assert np.array_equal(data.meta["index"], np.arange(len(data)))
    assert "no patient ids" in info.preprocessing["grouping"]
    assert info.source["official_files"] is False and len(info.source["md5"]) == 1


def test_grey_sets_and_larger_sizes(tmp_path):
    path = write_medmnist(tmp_path / "raw", set_name="organamnist", size=64, train=22,
                          val=11, test=11).path
    assert path.name == "organamnist_64.npz"
    info = read_info(preprocess_medmnist(path, tmp_path / "organ.h5"))
    assert (info.channels, info.image_size) == (1, (64, 64))
    assert info.domain == "generic"  # a flipped left kidney is a right one: no flips
    assert len(info.class_names) == 11


def test_the_published_table():
    counts = {"pathmnist": 9, "dermamnist": 7, "octmnist": 4, "pneumoniamnist": 2,
              "retinamnist": 5, "breastmnist": 2, "bloodmnist": 8, "tissuemnist": 8,
              "organamnist": 11, "organcmnist": 11, "organsmnist": 11, "chestmnist": 14}
    assert {f: len(s.classes) for f, s in SETS.items()} == counts
    assert SETS["pathmnist"].channels == 3 and SETS["pathmnist"].domain == "histology"
    assert all(len(s.md5) == 4 and all(len(v) == 32 for v in s.md5.values())
               for s in SETS.values())
    assert len({v for s in SETS.values() for v in s.md5.values()}) == 48  # all distinct


@pytest.mark.parametrize(("name", "config", "message"), [
    ("chestmnist.npz", MedmnistConfig(), "multi-label"),
    ("organmnist3d.npz", MedmnistConfig(), "3D set"),
    ("retinamnist.npz", MedmnistConfig(), "--ordinal-as-classes"),
    ("mydata.npz", MedmnistConfig(), "cannot tell which MedMNIST set"),
    ("pathmnist.npz", MedmnistConfig(set_name="bloodmnist"), "the file name says pathmnist"),
])
def test_sets_capsmed_cannot_train_as_published_are_refused(tmp_path, blood, name, config,
                                                             message):
    path = tmp_path / name
    path.write_bytes(blood.read_bytes())
    with pytest.raises(CapsmedError, match=message):
        preprocess_medmnist(path, tmp_path / "out.h5", config)
    assert not (tmp_path / "out.h5").exists()
    assert set(SETS_3D).isdisjoint(SETS)


def test_ordinal_grades_train_as_classes_when_asked(tmp_path):
    path = write_medmnist(tmp_path, set_name="retinamnist", train=10, val=5, test=5).path
    info = read_info(preprocess_medmnist(path, tmp_path / "retina.h5",
                                         MedmnistConfig(ordinal_as_classes=True)))
    assert info.preprocessing["task"] == "ordinal-regression"
    assert info.preprocessing["ordinal_as_classes"] is True and info.domain == "fundus"


def test_ordinal_as_classes_on_a_set_without_grades_is_refused(blood, tmp_path):
    """The flag was ignored for a set that is not ordinal, and the file recorded
    ``ordinal_as_classes: false`` against what was asked."""
    out = tmp_path / "blood.h5"
    result = runner.invoke(app, ["-q", "preprocess", "medmnist", str(blood), "-o", str(out),
                                 "--ordinal-as-classes"])
    assert_clean_failure(result, f"{blood}: --ordinal-as-classes applies to ordinal sets "
                         "(retinamnist); bloodmnist has no ordinal grades", out)


class _Trap:
    """Unpickling this touches a file: the test sees whether anything unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _save(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    with path.open("wb") as fh:
        np.savez(fh, **arrays)
    return path


def _bad(blood: Path, tmp_path: Path, case: str) -> Path:
    arrays = _arrays(blood)
    path = tmp_path / "bloodmnist.npz"
    if case == "missing":
        del arrays["val_labels"]
    elif case == "float-images":
        arrays["train_images"] = arrays["train_images"].astype(np.float32)
    elif case == "grey-images":
        arrays["test_images"] = arrays["test_images"][..., 0]
    elif case == "float-labels":
        arrays["train_labels"] = arrays["train_labels"].astype(np.float64)
    elif case == "label-range":
        arrays["test_labels"][3] = 8
    elif case == "negative-label":
        arrays["test_labels"] = arrays["test_labels"].astype(np.int64)
        arrays["test_labels"][0] = -1
    elif case == "multi-label":
        arrays["val_labels"] = np.zeros((16, 14), np.uint8)
    elif case == "count":
        arrays["val_labels"] = arrays["val_labels"][:-1]
    elif case == "empty-val":  # the val split silently dropped: no model selection
        arrays["val_images"] = arrays["val_images"][:0]
        arrays["val_labels"] = arrays["val_labels"][:0]
    elif case == "not-square":
        arrays = {k: v[:, :, :20] if k.endswith("images") else v for k, v in arrays.items()}
    elif case == "size-name":
        path = tmp_path / "bloodmnist_64.npz"
    elif case == "object-array":
        arrays["train_labels"] = np.array([_Trap(tmp_path / "unpickled")], dtype=object)
        with path.open("wb") as fh:
            np.savez(fh, **arrays)  # np.savez pickles object arrays
        return path
    elif case == "pickle":
        path.write_bytes(pickle.dumps(_Trap(tmp_path / "unpickled")))
        return path
    elif case == "npy":
        with path.open("wb") as fh:
            np.save(fh, arrays["train_images"])
        return path
    elif case == "truncated":
        data = blood.read_bytes()
        path.write_bytes(data[:len(data) // 2])
        return path
    elif case == "corrupt":
        data = bytearray(_save(path, arrays).read_bytes())
        with zipfile.ZipFile(path) as zf:
            info = zf.getinfo("train_images.npy")
        data[info.header_offset + 200] ^= 0xFF  # inside the member's data: a CRC error
        path.write_bytes(bytes(data))
        return path
    return _save(path, arrays)


@pytest.mark.parametrize(("case", "message"), [
    ("missing", "missing array(s) val_labels"),
    ("float-images", "train_images is float32, expected uint8"),
    ("grey-images", "test_images has shape [24, 28, 28], expected [N, H, W, 3]"),
    ("float-labels", "train_labels is float64, expected integers"),
    ("label-range", "test_labels holds 1 label(s) outside 0..7 (e.g. 8)"),
    ("negative-label", "outside 0..7 (e.g. -1)"),
    ("multi-label", "val_labels has shape [16, 14], expected [16, 1] (several labels"),
    ("count", "val_labels has shape [15, 1], expected [16, 1]"),
    ("empty-val", "val_images holds no images; a MedMNIST file has images in each"),
    ("not-square", "are 28x20, expected square images"),
    ("size-name", "the name announces 64 px images, the arrays hold 28 px ones"),
    ("object-array", "train_labels holds Python objects (a pickled array); refused"),
    ("pickle", "a Python pickle (refused: unpickling runs code)"),
    ("npy", "a single .npy array; expected a .npz archive"),
    ("truncated", "not a zip archive"),
    ("corrupt", "cannot read train_images"),
])
def test_bad_archives_are_refused_with_one_line_and_no_output(blood, tmp_path, case,
                                                              message):
    path = _bad(blood, tmp_path, case)
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "medmnist", str(path), "-o", str(out)])
    assert_clean_failure(result, message, out)
    assert str(path) in result.stderr
    assert not (tmp_path / "unpickled").exists()


def test_predict_replays_the_stored_images_and_refuses_others(blood, tmp_path):
    out = preprocess_medmnist(blood, tmp_path / "blood.h5")
    recipe = make_recipe(DatasetRecord.from_info(read_info(out)), Overrides())
    stored = load_split(out, "test").images[7]
    png = tmp_path / "cell.png"
    cv2.imwrite(str(png), stored.transpose(1, 2, 0)[..., ::-1])  # OpenCV writes BGR
    prepared = recipe.prepare(png, None)
    images, centres = next(prepared.chunks)
    assert np.array_equal(images[0], stored) and prepared.expected == 1
    cv2.imwrite(str(tmp_path / "big.png"), np.zeros((56, 56, 3), np.uint8))
    with pytest.raises(CapsmedError, match="image is 56x56, but the run was trained on "
                                           "bloodmnist images of 28x28"):
        recipe.prepare(tmp_path / "big.png", None)
    cv2.imwrite(str(tmp_path / "grey.png"), stored[0])
    with pytest.raises(CapsmedError, match="a grey image, but bloodmnist images are colour"):
        recipe.prepare(tmp_path / "grey.png", None)


def test_a_grey_run_takes_a_grey_image_saved_as_rgb(tmp_path):
    path = write_medmnist(tmp_path, set_name="pneumoniamnist", train=8, val=4, test=4).path
    out = preprocess_medmnist(path, tmp_path / "pneu.h5")
    recipe = make_recipe(DatasetRecord.from_info(read_info(out)), Overrides())
    stored = load_split(out, "train").images[0]
    cv2.imwrite(str(tmp_path / "rgb.png"), np.repeat(stored[0][..., None], 3, axis=2))
    assert np.array_equal(next(recipe.prepare(tmp_path / "rgb.png", None).chunks)[0][0],
                          stored)
    tinted = np.repeat(stored[0][..., None], 3, axis=2)
    tinted[0, 0, 1] ^= 1
    cv2.imwrite(str(tmp_path / "tinted.png"), tinted)
    with pytest.raises(CapsmedError, match="a colour image, but pneumoniamnist images are grey"):
        recipe.prepare(tmp_path / "tinted.png", None)


def test_fetch_downloads_and_verifies_from_a_loopback_server(tmp_path, blood, monkeypatch):
    from tests.test_fetch import _Server

    body = blood.read_bytes()
    with _Server({"bloodmnist.npz": body}) as server:
        result = runner.invoke(app, ["-q", "fetch", "medmnist", "bloodmnist",
                                     str(tmp_path / "a"), "--mirror", server.url])
        victim = tmp_path / "a" / "bloodmnist.npz"
        assert_clean_failure(result, str(victim), victim)  # not the published bytes
        assert f"expected {SETS['bloodmnist'].md5[28]}" in result.stderr
        # the same download with this file's MD5 as the published one succeeds
        md5 = hashlib.md5(body, usedforsecurity=False).hexdigest()
        monkeypatch.setitem(SETS["bloodmnist"].md5, 28, md5)
        result = runner.invoke(app, ["-q", "fetch", "medmnist", "bloodmnist",
                                     str(tmp_path / "b"), "--mirror", server.url])
        assert result.exit_code == 0, result.output
        assert server.requests[-1][0] == "/data/bloodmnist.npz"
    assert (tmp_path / "b" / "bloodmnist.npz").read_bytes() == body
    info = read_info(preprocess_medmnist(tmp_path / "b" / "bloodmnist.npz",
                                         tmp_path / "b.h5"))
    assert info.source["official_files"] is True


def test_fetch_names_the_record_and_refuses_unknown_sets_and_sizes():
    assert remote("pathmnist", 224).md5 == {"pathmnist_224.npz": SETS["pathmnist"].md5[224]}
    assert remote("bloodmnist").mirrors == ("https://zenodo.org/records/10519652/files/",)
    for args, message in ((("chestnut",), "unknown MedMNIST set"),
                          (("bloodmnist", 32), "--size must be one of 28, 64, 128, 224")):
        with pytest.raises(CapsmedError, match=message):
            remote(*args)


def test_another_sets_published_file_is_not_given_the_chosen_sets_classes(tmp_path,
                                                                          monkeypatch):
    """A published DermaMNIST file (7 RGB classes) renamed, preprocessed with --set
    bloodmnist (8 RGB classes): its labels fit, so only its MD5 tells it apart."""
    derma = write_medmnist(tmp_path / "raw", set_name="dermamnist", train=14, val=7,
                           test=7).path
    md5 = hashlib.md5(derma.read_bytes(), usedforsecurity=False).hexdigest()
    monkeypatch.setitem(SETS["dermamnist"].md5, 28, md5)  # as if it were the published one
    renamed = tmp_path / "download.npz"
    renamed.write_bytes(derma.read_bytes())
    out = tmp_path / "out.h5"
    with pytest.raises(CapsmedError, match="published dermamnist.npz, not a bloodmnist "
                                           "file; pass --set dermamnist"):
        preprocess_medmnist(renamed, out, MedmnistConfig(set_name="bloodmnist"))
    assert not out.exists()
    info = read_info(preprocess_medmnist(renamed, out, MedmnistConfig(set_name="dermamnist")))
    assert info.class_names == SETS["dermamnist"].classes
    assert info.source["official_files"] is True


def test_a_member_zipped_with_an_unsupported_method_is_refused_in_one_line(blood, tmp_path):
    """A .npz re-zipped with Deflate64 (method 9, which Python's zipfile cannot read)
    stopped with a NotImplementedError traceback."""
    stored = tmp_path / "bloodmnist.npz"
    with zipfile.ZipFile(blood) as src, zipfile.ZipFile(stored, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_STORED)
    data = bytearray(stored.read_bytes())
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        start = 0
        while (start := data.find(signature, start)) >= 0:
            data[start + offset:start + offset + 2] = (9).to_bytes(2, "little")
            start += 4
    stored.write_bytes(bytes(data))
    out = tmp_path / "out.h5"
    result = CliRunner().invoke(app, ["-q", "preprocess", "medmnist", str(stored), "-o",
                                      str(out)])
    assert_clean_failure(result, "compression method", out)
