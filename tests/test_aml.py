"""AML-Cytomorphology_LMU: synthetic release -> preprocessing, folds, labels, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import class_counts, load_split, read_info
from capsmed.data.sources.aml.reader import (
    CLASS_NAMES,
    AmlConfig,
    preprocess_aml,
    read_rgba_as_rgb,
)
from capsmed.data.sources.aml.synth import class_counts as synth_counts
from capsmed.data.sources.aml.synth import render_cell

runner = CliRunner()
SCALE, SIZE, SEED = 0.002, 64, 5
TABLE2 = ("NGS", "NGB", "LYT", "LYA", "MON", "EOS", "BAS", "MYO", "PMO", "PMB", "MYB", "MMZ",
          "MOB", "EBO", "KSC")


def _annotation_fields(raw: Path) -> list[list[str]]:
    return [line.split() for line in (raw / "annotations.dat").read_text().splitlines()]


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """Synthetic release written by the real CLI: 58 images of 64x64, all 15 classes."""
    root = tmp_path_factory.mktemp("aml") / "raw"
    result = runner.invoke(app, ["-q", "synth", "aml", str(root), "--per-class-scale",
                                 str(SCALE), "--size", str(SIZE), "--seed", str(SEED)])
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture(scope="module")
def h5(raw, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("aml_h5") / "aml.h5"
    result = runner.invoke(app, ["-q", "preprocess", "aml", str(raw), "-o", str(out),
                                 "--workers", "1"])
    assert result.exit_code == 0, result.output
    return out


def test_synth_follows_release_imbalance_and_layout(raw):
    assert synth_counts(0.005, 2) == {
        "NGS": 42, "NGB": 2, "LYT": 20, "LYA": 2, "MON": 9, "EOS": 2, "BAS": 2, "MYO": 16,
        "PMO": 2, "PMB": 2, "MYB": 2, "MMZ": 2, "MOB": 2, "EBO": 2, "KSC": 2}
    expected = synth_counts(SCALE, 2)
    assert expected["NGS"] == 17 and expected["LYT"] == 8 and expected["MYO"] == 7
    for cls, n in expected.items():
        files = sorted(p.name for p in (raw / "AML-Cytomorphology" / cls).iterdir())
        assert files == [f"{cls}_{i:04d}.tiff" for i in range(1, n + 1)]
    fields = _annotation_fields(raw)
    assert len(fields) == sum(expected.values()) == 58
    assert all(len(f) == 4 and f[0].split("/")[0] == f[1] for f in fields)
    kinds = {"nan" if f[2:] == ["nan", "nan"] else "unc" if "UNC" in f[2:]
             else "agree" if f[2:] == [f[1]] * 2 else "disagree" for f in fields}
    assert kinds == {"nan", "unc", "agree", "disagree"}
    with tifffile.TiffFile(raw / "AML-Cytomorphology" / "NGS" / "NGS_0001.tiff") as tif:
        page = tif.pages[0]
        assert page.shape == (SIZE, SIZE, 4) and int(page.extrasamples[0]) == 2
        assert (page.asarray()[..., 3] == 255).all()


def test_synth_is_deterministic_and_classes_differ():
    a = render_cell(np.random.default_rng([1, 0, 1]), "EOS", 96)
    assert np.array_equal(a, render_cell(np.random.default_rng([1, 0, 1]), "EOS", 96))
    assert not np.array_equal(a, render_cell(np.random.default_rng([2, 0, 1]), "EOS", 96))
    # eosinophil granules are orange-red, basophil granules near-black purple
    eos = render_cell(np.random.default_rng(3), "EOS", 400)[..., :3].astype(int)
    bas = render_cell(np.random.default_rng(3), "BAS", 400)[..., :3].astype(int)
    centre = np.s_[150:250, 150:250]
    assert (eos[centre][..., 0] - eos[centre][..., 2]).max() > 100
    assert bas[centre].sum(axis=-1).min() < 200


def test_end_to_end_counts_images_and_record(raw, h5):
    info = read_info(h5)
    assert info.dataset == "aml" and info.class_names == TABLE2 == CLASS_NAMES
    assert info.split_sizes == {"all": 58} and info.folds == {"all": 5}
    assert info.channels == 3 and info.image_size == (28, 28)
    expected = synth_counts(SCALE, 2)
    assert class_counts(h5)["all"].tolist() == [expected[c] for c in TABLE2]
    data = load_split(h5, "all", with_meta=True)
    assert len(set(data.groups)) == 58  # one group per image: no patient ids
    for i in (0, 20, 57):
        src = data.meta["source"][i]
        assert TABLE2[data.labels[i]] == src.split("/")[0]
        assert data.groups[i] == Path(src).stem
        rgb = tifffile.imread(raw / "AML-Cytomorphology" / src)[..., :3]
        small = cv2.resize(rgb, (28, 28), interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(data.images[i], small.transpose(2, 0, 1))
    assert (data.meta["source_hw"] == SIZE).all()
    pre = info.preprocessing
    assert pre["source_size"] == {"histogram": {"64x64": 58}, "min_hw": [64, 64],
                                  "max_hw": [64, 64], "non_square": 0}
    assert pre["class_full_names"][0] == "Neutrophil (segmented)"
    assert pre["class_full_names"][-1] == "Smudge cell"
    assert pre["size"] == 28 and pre["labels"] == "original" and pre["seed"] == 0
    assert len(info.source["files"]) == 58


def test_folds_are_stratified_and_seeded(raw, h5, tmp_path):
    data = load_split(h5, "all")
    per_class = np.zeros((15, 5), int)
    np.add.at(per_class, (data.labels, data.folds.astype(int)), 1)
    # every class spread as evenly as possible: fold counts differ by at most one,
    # including classes with fewer images than folds (2 < 5: present in two folds)
    assert (per_class.max(axis=1) - per_class.min(axis=1) <= 1).all()
    assert sorted(per_class[TABLE2.index("NGS")]) == [3, 3, 3, 4, 4]  # 17 images
    assert sorted(per_class[TABLE2.index("KSC")]) == [0, 0, 0, 1, 1]  # 2 images
    again = preprocess_aml(raw, tmp_path / "again.h5", AmlConfig(workers=1, size=8),
                           disable_progress=True)
    np.testing.assert_array_equal(load_split(again, "all").folds, data.folds)
    other = preprocess_aml(raw, tmp_path / "other.h5", AmlConfig(workers=1, size=8, seed=1),
                           disable_progress=True)
    assert not np.array_equal(load_split(other, "all").folds, data.folds)


def test_labels_agreed_drops_exactly_disagreeing_and_unc(raw, tmp_path):
    out = tmp_path / "agreed.h5"
    result = runner.invoke(app, ["-q", "preprocess", "aml", str(raw), "-o", str(out),
                                 "--labels", "agreed", "--folds", "2", "--workers", "1"])
    assert result.exit_code == 0, result.output
    fields = _annotation_fields(raw)
    dropped = {f[0] for f in fields if any(r not in ("nan", f[1]) for r in f[2:])}
    kept = {f[0] for f in fields} - dropped
    assert dropped and {f[0] for f in fields if f[2:] == ["nan", "nan"]} <= kept
    data = load_split(out, "all", with_meta=True)
    assert set(data.meta["source"]) == kept and len(data.labels) == len(kept)
    assert read_info(out).preprocessing["dropped_by_labels"] == len(dropped)


def test_grey_and_size_options(raw, h5, tmp_path):
    grey = tmp_path / "grey.h5"
    result = runner.invoke(app, ["-q", "preprocess", "aml", str(raw), "-o", str(grey),
                                 "--grey", "--workers", "1"])
    assert result.exit_code == 0, result.output
    colour, g = load_split(h5, "all"), load_split(grey, "all")
    assert g.images.shape == (58, 1, 28, 28) and read_info(grey).channels == 1
    expected = [cv2.cvtColor(np.ascontiguousarray(im.transpose(1, 2, 0)), cv2.COLOR_RGB2GRAY)
                for im in colour.images[:5]]
    np.testing.assert_array_equal(g.images[:5, 0], np.stack(expected))
    big = tmp_path / "big.h5"
    result = runner.invoke(app, ["-q", "preprocess", "aml", str(raw), "-o", str(big),
                                 "--size", "64", "--workers", "1"])
    assert result.exit_code == 0, result.output
    data = load_split(big, "all", with_meta=True)
    assert data.images.shape == (58, 3, 64, 64) and read_info(big).image_size == (64, 64)
    source = tifffile.imread(raw / "AML-Cytomorphology" / data.meta["source"][3])
    np.testing.assert_array_equal(data.images[3], source[..., :3].transpose(2, 0, 1))


def test_rgba_to_rgb_on_hand_made_pixels(tmp_path):
    px = np.array([[[200, 100, 50, 255], [200, 100, 50, 0], [200, 100, 50, 128]]], np.uint8)
    path = tmp_path / "unassoc.tiff"
    tifffile.imwrite(path, px, photometric="rgb", extrasamples=["unassalpha"])
    rgb, translucent = read_rgba_as_rgb(path)
    # 128/255 of the colour over 127/255 of white: 200 -> 227.4, 100 -> 177.2, 50 -> 152.1
    assert rgb.tolist() == [[[200, 100, 50], [255, 255, 255], [227, 177, 152]]]
    assert translucent
    tifffile.imwrite(path, np.array([[[100, 50, 25, 128]]], np.uint8), photometric="rgb",
                     extrasamples=["assocalpha"])  # premultiplied: add white's share only
    assert read_rgba_as_rgb(path)[0].tolist() == [[[227, 177, 152]]]
    tifffile.imwrite(path, px, photometric="rgb", extrasamples=["unspecified"])
    assert read_rgba_as_rgb(path)[0].tolist() == [[[200, 100, 50]] * 3]
    tifffile.imwrite(path, px[..., :3], photometric="rgb")  # plain RGB passes through
    rgb, translucent = read_rgba_as_rgb(path)
    assert rgb.tolist() == [[[200, 100, 50]] * 3] and not translucent


@pytest.mark.slow
def test_workers_give_identical_output(raw, h5, tmp_path):
    cfg = AmlConfig(workers=2, chunk_size=16)
    out = preprocess_aml(raw, tmp_path / "pool.h5", cfg, disable_progress=True)
    a, b = load_split(h5, "all", with_meta=True), load_split(out, "all", with_meta=True)
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.folds, b.folds)
    np.testing.assert_array_equal(a.meta["source"], b.meta["source"])


@pytest.mark.parametrize("layout", ["image-root-with-dat-beside", "dat-inside", "explicit"])
def test_accepted_layouts(raw, h5, tmp_path, layout):
    copy = tmp_path / "copy"
    shutil.copytree(raw, copy)
    args = []
    target = copy
    if layout == "image-root-with-dat-beside":
        target = copy / "AML-Cytomorphology"
    elif layout == "dat-inside":
        (copy / "annotations.dat").rename(copy / "AML-Cytomorphology" / "annotations.dat")
    else:
        (copy / "annotations.dat").rename(tmp_path / "elsewhere.dat")
        args = ["--annotations", str(tmp_path / "elsewhere.dat")]
    out = tmp_path / "layout.h5"
    result = runner.invoke(app, ["-q", "preprocess", "aml", str(target), "-o", str(out),
                                 "--workers", "1", *args])
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(load_split(out, "all").images, load_split(h5, "all").images)


def test_unlisted_image_is_kept_with_its_folder_label(raw, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(raw, copy)
    folder = copy / "AML-Cytomorphology" / "MOB"
    shutil.copy(folder / "MOB_0001.tiff", folder / "MOB_0099.tiff")
    out = preprocess_aml(copy, tmp_path / "u.h5", AmlConfig(workers=1, folds=2, size=8),
                         disable_progress=True)
    pre = read_info(out).preprocessing
    assert pre["unlisted_images"] == 1 and pre["unlisted_examples"] == ["MOB/MOB_0099.tiff"]
    assert class_counts(out)["all"][TABLE2.index("MOB")] == 3


def test_tiffs_outside_the_class_folders_are_warned_about(raw, tmp_path, caplog):
    copy = tmp_path / "copy"
    shutil.copytree(raw, copy)
    cells = copy / "AML-Cytomorphology"
    (cells / "MOB" / "more").mkdir()
    shutil.copy(cells / "MOB" / "MOB_0001.tiff", cells / "MOB" / "more" / "MOB_0101.tiff")
    shutil.copy(cells / "MOB" / "MOB_0001.tiff", cells / "MOB_0102.tiff")
    with caplog.at_level("WARNING"):
        preprocess_aml(copy, tmp_path / "u.h5", AmlConfig(workers=1, folds=2, size=8),
                       disable_progress=True)
    assert ("2 TIFF(s) under" in caplog.text and "MOB/more/MOB_0101.tiff" in caplog.text
            and "MOB_0102.tiff" in caplog.text)


def _drop_annotations(raw):
    (raw / "annotations.dat").unlink()
    return raw


def _missing_file(raw):
    (raw / "AML-Cytomorphology" / "LYT" / "LYT_0003.tiff").unlink()
    return raw / "annotations.dat"


def _corrupt_tiff(raw):
    victim = raw / "AML-Cytomorphology" / "MON" / "MON_0002.tiff"
    victim.write_bytes(victim.read_bytes()[:300])  # a truncated download
    return victim


def _edit_line(raw, number, new):
    path = raw / "annotations.dat"
    lines = path.read_text().splitlines()
    lines[number] = new
    path.write_text("\n".join(lines) + "\n")
    return path


def _empty_folder(raw):
    folder = raw / "AML-Cytomorphology" / "KSC"
    for p in folder.iterdir():
        p.unlink()
    return folder


def _converted_image(raw):
    folder = raw / "AML-Cytomorphology" / "EOS"
    rgb = tifffile.imread(folder / "EOS_0001.tiff")[..., :3]
    cv2.imwrite(str(folder / "EOS_0900.png"), rgb)  # was silently left out of the data
    return folder / "EOS_0900.png"


def _unknown_folder(raw):
    folder = raw / "AML-Cytomorphology" / "XYZ"
    folder.mkdir()
    shutil.copy(raw / "AML-Cytomorphology" / "BAS" / "BAS_0001.tiff", folder / "XYZ_0001.tiff")
    return folder


@pytest.mark.parametrize("corrupt, message", [
    (_drop_annotations, "annotations.dat not found"),
    (_missing_file, "LYT_0003.tiff, which does not exist"),
    (_corrupt_tiff, "cannot read TIFF"),
    (lambda r: _edit_line(r, 0, "BAS/BAS_0001.tiff XYZ nan nan"), "line 1: unknown class label"),
    (lambda r: _edit_line(r, 1, "BAS/BAS_0002.tiff BAS NGS ABC"), "line 2: unknown class label"),
    (lambda r: _edit_line(r, 0, "BAS/BAS_0001.tiff EOS nan nan"), "but labelled EOS"),
    (lambda r: _edit_line(r, 2, "EBO/EBO_0001.tiff EBO nan"), "line 3: expected 4 fields"),
    (lambda r: _edit_line(r, 2, "../EBO_0001.tiff EBO nan nan"), "expected a path like"),
    (_empty_folder, "holds no .tiff images"),
    (_unknown_folder, "is not one of the 15 classes"),
    (_converted_image, "not a TIFF; only .tif/.tiff images are read"),
], ids=["no-annotations", "missing-file", "corrupt-tiff", "unknown-label",
        "unknown-reannotation", "label-vs-folder", "short-line", "path-escape", "empty-folder",
        "unknown-folder", "converted-image"])
def test_bad_input_fails_cleanly(raw, tmp_path, corrupt, message):
    copy = tmp_path / "raw"
    shutil.copytree(raw, copy)
    victim = corrupt(copy)
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "aml", str(copy), "-o", str(out),
                                 "--folds", "2", "--workers", "1"])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert str(victim) in lines[0] and message in lines[0]
    assert not out.exists() and not list(tmp_path.glob(".out.h5*"))


def test_more_folds_than_images_and_bad_options(raw, tmp_path):
    out = tmp_path / "x.h5"
    for args, message in ((["--folds", "99"], "cannot be split into 99 folds"),
                          (["--folds", "40"], "every class has fewer images than the 40 "
                                              "folds (the largest, NGS, has"),
                          (["--labels", "majority"], "labels must be one of"),
                          (["--folds", "1"], "folds must be within 2..127")):
        result = runner.invoke(app, ["-q", "preprocess", "aml", str(raw), "-o", str(out),
                                     "--workers", "1", *args])
        assert result.exit_code == 1 and message in result.stderr, result.output
        assert not out.exists()


def test_record_is_json_and_lists_dropped_examples(raw, tmp_path):
    out = preprocess_aml(raw, tmp_path / "a.h5", AmlConfig(workers=1, labels="agreed",
                                                           folds=2, size=8),
                         disable_progress=True)
    pre = read_info(out).preprocessing
    assert pre["reannotated"] == sum(f[2:] != ["nan", "nan"] for f in _annotation_fields(raw))
    assert set(pre["dropped_examples"]) <= {f[0] for f in _annotation_fields(raw)}
    json.dumps(pre)  # the record round-trips
