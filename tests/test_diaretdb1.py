"""DIARETDB1: CLAHE enhancement, synthetic v1.1 layout, preprocessing, bad input via the CLI."""

from __future__ import annotations

import shutil

import cv2
import numpy as np
import pytest
import tifffile
from PIL import Image
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import groups_by_split, load_split, read_info
from capsmed.data.enhance import clahe_green, clahe_lab
from capsmed.data.sources.diaretdb1.layout import (
    LESION_TYPES,
    locate_resources,
    read_split_list,
)
from capsmed.data.sources.diaretdb1.reader import Diaretdb1Config, preprocess_diaretdb1
from capsmed.data.sources.diaretdb1.synth import OFFICIAL_TRAIN, write_diaretdb1
from capsmed.errors import CapsmedError
from tests.helpers import assert_clean_failure

runner = CliRunner()
SIZE = (320, 246)  # about a fifth of the release's 1500x1152
PATCH = 48  # ~ the paper's 200 px at this scale
ARGS = ["--patch-size", str(PATCH), "--stride", "24", "--workers", "1"]


def _cfg(**kw) -> Diaretdb1Config:
    return Diaretdb1Config(**{"patch_size": PATCH, "stride": 24, "workers": 1, **kw})


def _splits(path):
    return {s: load_split(path, s, with_meta=True) for s in read_info(path).split_sizes}


def _preprocess(raw, out, *extra):
    return runner.invoke(app, ["-q", "preprocess", "diaretdb1", str(raw), "-o", str(out),
                               *ARGS, *extra])


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddb1") / "ddb1_v01_01"
    write_diaretdb1(root, images=8, size=SIZE, seed=5)
    return root


@pytest.fixture(scope="module")
def h5(raw, tmp_path_factory):
    out = tmp_path_factory.mktemp("h5") / "ddb1.h5"
    result = _preprocess(raw, out)
    assert result.exit_code == 0, result.output + str(result.exception)
    return out


def _truth(raw, image_id):
    """Independent reading of one image's maps: (lesion at 0.75, any marking, fov mask)."""
    res = raw / "resources" / "images"
    maps = {k: np.asarray(Image.open(res / "ddb1_groundtruth" / k / f"{image_id}.png"))[..., 0]
            for k in LESION_TYPES}
    lesion = np.any([m / 255.0 >= 0.75 for m in maps.values()], axis=0)
    marked = np.any([m > 0 for m in maps.values()], axis=0)
    fov = tifffile.imread(res / "ddb1_fundusmask" / "fmask.tif") > 127
    return lesion, marked, fov


def test_clahe_green_is_opencv_clahe_on_lab_lightness():
    rng = np.random.default_rng(0)
    flat = np.clip(120 + 8 * rng.standard_normal((96, 128, 3)), 0, 255).astype(np.uint8)
    green = clahe_green(flat, clip_limit=3.0, tile_grid=(4, 4))
    assert green.shape == (96, 128) and green.dtype == np.uint8
    lab = cv2.cvtColor(flat, cv2.COLOR_RGB2LAB)
    lab[..., 0] = cv2.createCLAHE(3.0, (4, 4)).apply(lab[..., 0].copy())
    np.testing.assert_array_equal(green, cv2.cvtColor(lab, cv2.COLOR_LAB2RGB)[..., 1])
    assert green.std() > 1.5 * flat[..., 1].std()  # local contrast went up
    np.testing.assert_array_equal(clahe_lab(flat, 3.0, (4, 4))[..., 1], green)


def test_synth_writes_the_v11_layout(raw, tmp_path):
    res = raw / "resources"
    ids = [f"image{n:03d}" for n in range(1, 9)]
    assert sorted(p.stem for p in (res / "images/ddb1_fundusimages").glob("*.png")) == ids
    fmask = tifffile.imread(res / "images/ddb1_fundusmask/fmask.tif")
    assert fmask.shape == SIZE[::-1] and set(np.unique(fmask)) == {0, 255}
    assert fmask[SIZE[1] // 2, SIZE[0] // 2] == 255 and fmask[0, 0] == 0
    values = set()
    for kind in LESION_TYPES:
        for image_id in ids:
            gt = np.asarray(Image.open(res / "images/ddb1_groundtruth" / kind / f"{image_id}.png"))
            assert gt.shape == (*SIZE[::-1], 3)
            assert (gt[..., 0] == gt[..., 1]).all() and (gt[..., 0] == gt[..., 2]).all()
            assert not gt[..., 0][fmask == 0].any()  # markings stay inside the fundus
            values |= set(np.unique(gt).tolist())
    assert values == {0, 64, 128, 191, 255}
    train = (res / "traindatasets/trainset.txt").read_text().splitlines()
    test = (res / "testdatasets/testset.txt").read_text().splitlines()
    assert train == [f"images/ddb1_fundusimages/image{n:03d}.png" for n in (1, 3, 4)]
    assert test == [f"images/ddb1_fundusimages/image{n:03d}.png" for n in (2, 5, 6, 7, 8)]
    assert len(OFFICIAL_TRAIN) == 28
    again = tmp_path / "again"
    write_diaretdb1(again, images=3, size=SIZE, seed=5)
    for rel in ("images/ddb1_fundusimages/image002.png",
                "images/ddb1_groundtruth/hemorrhages/image003.png"):
        assert (again / "resources" / rel).read_bytes() == (res / rel).read_bytes()


def test_split_follows_the_official_lists_by_image(raw, h5):
    groups = groups_by_split(h5)
    assert set(groups) == {"train", "val", "test"}
    assert groups["test"] == {"image002", "image005", "image006", "image007", "image008"}
    # one of the three official training images becomes validation (0.15 of 3, at least 1)
    assert len(groups["val"]) == 1 and groups["train"] | groups["val"] == {
        "image001", "image003", "image004"}
    assert not groups["train"] & groups["val"]
    info = read_info(h5)
    assert info.class_names == ("healthy", "lesion")
    assert info.channels == 1 and info.image_size == (28, 28)
    assert info.preprocessing["confidence"] == 0.75 and info.preprocessing["clip_limit"] == 3.0
    assert info.preprocessing["min_lesion_pixels_used"] == 3  # ceil((48 / 28)^2)
    assert info.preprocessing["images"]["val"] == sorted(groups["val"])
    files = info.source["files"]
    assert files["resources/images/ddb1_fundusmask/fmask.tif"] == (
        raw / "resources/images/ddb1_fundusmask/fmask.tif").stat().st_size
    assert "resources/traindatasets/trainset.txt" in files
    for split, data in _splits(h5).items():
        counts = np.bincount(data.labels, minlength=2)
        assert counts[0] == counts[1] > 0, split  # balanced within each split
        assert data.images.shape[1:] == (1, 28, 28) and data.images.dtype == np.uint8


def test_labels_agree_with_the_ground_truth(raw, h5):
    need, half = 3, PATCH // 2
    res = raw / "resources" / "images"
    checked_pixels = 0
    for data in _splits(h5).values():
        for image_id in np.unique(data.groups):
            lesion, marked, fov = _truth(raw, image_id)
            rgb = np.asarray(Image.open(res / "ddb1_fundusimages" / f"{image_id}.png"))
            rows, cols = np.nonzero(fov)
            box = (slice(rows.min(), rows.max() + 1), slice(cols.min(), cols.max() + 1))
            green = np.zeros(fov.shape, np.uint8)
            green[box] = clahe_green(rgb[box])
            green[~fov] = 0
            pick = np.flatnonzero(data.groups == image_id)
            for i in pick:
                r, c = data.meta["row"][i], data.meta["col"][i]
                win = (slice(r - half, r - half + PATCH), slice(c - half, c - half + PATCH))
                assert lesion[win].sum() == data.meta["lesion_pixels"][i]
                assert fov[win].mean() >= 0.75
                if data.labels[i] == 1:
                    assert lesion[win].sum() >= need
                else:
                    assert not marked[win].any()  # healthy: no marking at any confidence
            for i in pick[:3]:  # the stored pixels are the enhanced green channel, resized
                r, c = data.meta["row"][i], data.meta["col"][i]
                expected = cv2.resize(green[r - half:r - half + PATCH, c - half:c - half + PATCH],
                                      (28, 28), interpolation=cv2.INTER_AREA)
                np.testing.assert_array_equal(data.images[i, 0], expected)
                checked_pixels += 1
    assert checked_pixels > 0


def test_confidence_threshold_and_lesion_types_change_the_lesion_class(raw, tmp_path):
    def candidates(**kw):
        out = preprocess_diaretdb1(raw, tmp_path / "c.h5", _cfg(balance=False, **kw),
                                   overwrite=True)
        info = read_info(out)
        return np.sum(list(info.preprocessing["candidates"].values()), axis=0), _splits(out)

    strict, _ = candidates()
    loose, loose_data = candidates(confidence=0.25)
    assert strict[0] == loose[0]  # healthy means unmarked, whatever the threshold
    assert loose[1] > strict[1]  # 64- and 128-level markings now count as lesion
    assert strict[1] > 0
    only_dots, dot_data = candidates(lesions=("redsmalldots",), confidence=0.25)
    assert 0 < only_dots[1] < loose[1] and only_dots[0] == loose[0]
    res = raw / "resources/images/ddb1_groundtruth/redsmalldots"
    half = PATCH // 2
    for data in dot_data.values():
        for i in np.flatnonzero(data.labels == 1):
            dots = np.asarray(Image.open(res / f"{data.groups[i]}.png"))[..., 0]
            r, c = data.meta["row"][i], data.meta["col"][i]
            window = dots[r - half:r - half + PATCH, c - half:c - half + PATCH]
            assert (window >= 64).sum() == data.meta["lesion_pixels"][i] >= 3
    unbalanced = sum(len(d) for d in loose_data.values())
    assert unbalanced == loose.sum()


def test_threshold_is_value_over_255_at_least_confidence(raw, tmp_path):
    copy = tmp_path / "raw"
    shutil.copytree(raw, copy)
    gt = np.zeros((*SIZE[::-1], 3), np.uint8)
    gt[100:111, 100:111] = 191  # 0.7490: below the toolkit's 0.75
    gt[100:111, 115:126] = 192  # 0.7529: above it
    cv2.imwrite(str(copy / "resources/images/ddb1_groundtruth/hemorrhages/image002.png"), gt)

    def lesion_pixels(confidence):
        out = preprocess_diaretdb1(copy, tmp_path / f"{confidence}.h5", _cfg(
            lesions=("hemorrhages",), confidence=confidence, balance=False))
        test = _splits(out)["test"]
        return test.meta["lesion_pixels"][test.groups == "image002"]

    assert lesion_pixels(0.75).max() == 121  # only the 192 block counts
    assert lesion_pixels(191 / 255).max() == 242  # both blocks fit in one 48 px patch
    assert lesion_pixels(0.76).max() == 0


@pytest.mark.slow
def test_same_output_for_a_seed_and_any_number_of_workers(raw, h5, tmp_path):
    again = preprocess_diaretdb1(raw, tmp_path / "again.h5", _cfg())
    pooled = preprocess_diaretdb1(raw, tmp_path / "pool.h5", _cfg(workers=2))
    reference = _splits(h5)
    for path in (again, pooled):
        for split, data in _splits(path).items():
            np.testing.assert_array_equal(data.images, reference[split].images)
            np.testing.assert_array_equal(data.labels, reference[split].labels)
            np.testing.assert_array_equal(data.meta["row"], reference[split].meta["row"])


def test_split_lists_are_parsed_robustly(tmp_path):
    path = tmp_path / "list.txt"
    path.write_bytes(b"\xef\xbb\xbfimages/ddb1_fundusimages/image003.png\r\n\r\n"
                     b"image001.png\r\n# a comment\n  image010  \n"
                     b"images/diaretdb1_image005.png groundtruth/diaretdb1_image005_01_plain.xml\n"
                     b"image003.png\n")
    assert read_split_list(path) == ["image003", "image001", "image010", "image005"]
    path.write_text("image001.png\nfilename\n")
    with pytest.raises(CapsmedError, match="line 2: no DIARETDB1 image name in 'filename'"):
        read_split_list(path)
    path.write_text("image002.png\nimage001, image003, image004\n")  # was image001 only
    with pytest.raises(CapsmedError, match="line 2: names 3 images .image001, image003, "
                                           "image004.; give one image per line"):
        read_split_list(path)


def test_user_split_files_replace_the_official_lists(raw, tmp_path):
    (tmp_path / "tr.txt").write_text("image002.png\r\nimage003.png\r\n")
    (tmp_path / "va.txt").write_text("images/ddb1_fundusimages/image005.png\n")
    (tmp_path / "te.txt").write_text("image001\nimage004\n")
    out = tmp_path / "user.h5"
    result = _preprocess(raw, out, "--split-file", f"train={tmp_path / 'tr.txt'}",
                         "--split-file", f"val={tmp_path / 'va.txt'}",
                         "--split-file", f"test={tmp_path / 'te.txt'}")
    assert result.exit_code == 0, result.output
    assert groups_by_split(out) == {"train": {"image002", "image003"}, "val": {"image005"},
                                    "test": {"image001", "image004"}}
    # a test image also in train; a line naming several images (commas), of which
    # only the first was kept
    for name, listed, message in (("leak", "image003\n", "image003 is also listed in"),
                                  ("comma", "image001\nimage004, image005\n",
                                   "line 2: names 2 images")):
        (tmp_path / "te.txt").write_text(listed)
        result = _preprocess(raw, tmp_path / f"{name}.h5", "--split-file",
                             f"train={tmp_path / 'tr.txt'}", "--split-file",
                             f"test={tmp_path / 'te.txt'}")
        assert_clean_failure(result, str(tmp_path / "te.txt"), tmp_path / f"{name}.h5")
        assert message in result.stderr


def test_raw_dir_may_be_the_release_or_its_parent(raw, tmp_path):
    assert locate_resources(raw) == raw / "resources"
    assert locate_resources(raw / "resources") == raw / "resources"
    assert locate_resources(raw.parent) == raw / "resources"  # the ddb1_v01_01 parent
    parent = tmp_path / "two"
    for name in ("a", "b"):
        shutil.copytree(raw / "resources" / "testdatasets",
                        parent / name / "resources" / "testdatasets")
        (parent / name / "resources/images/ddb1_fundusimages").mkdir(parents=True)
    with pytest.raises(CapsmedError, match="several DIARETDB1 trees"):
        locate_resources(parent)


def test_config_rejects_unknown_lesion_types():
    with pytest.raises(CapsmedError, match="unknown: drusen"):
        Diaretdb1Config(lesions=("hemorrhages", "drusen"))
    result = runner.invoke(app, ["preprocess", "diaretdb1", ".", "-o", "x.h5",
                                 "--lesions", "drusen"])
    assert result.exit_code == 1 and "unknown: drusen" in result.stderr
    for empty in ("", ","):  # names no lesion type: not the default four
        result = runner.invoke(app, ["preprocess", "diaretdb1", ".", "-o", "x.h5",
                                     "--lesions", empty])
        assert result.exit_code == 1 and "lesions must be a non-empty subset" in \
            result.stderr, result.output


def _drop_fundus_images(res):
    shutil.rmtree(res / "images/ddb1_fundusimages")
    return res / "images/ddb1_fundusimages", "no such folder"


def _list_names_missing_image(res):
    path = res / "testdatasets/testset.txt"
    path.write_text(path.read_text() + "images/ddb1_fundusimages/image077.png\n")
    return path, "lists image077"


def _truncate_fundus_image(res):
    path = res / "images/ddb1_fundusimages/image005.png"
    path.write_bytes(path.read_bytes()[:3000])
    return path, "cannot read fundus image"


def _corrupt_ground_truth(res):
    path = res / "images/ddb1_groundtruth/softexudates/image002.png"
    path.write_bytes(b"\x89PNG not really")
    return path, "cannot read ground-truth map"


def _ground_truth_wrong_size(res):
    path = res / "images/ddb1_groundtruth/hemorrhages/image003.png"
    cv2.imwrite(str(path), np.zeros((100, 120, 3), np.uint8))
    return path, "ground-truth map is uint8 120x100, expected uint8 320x246 like image003.png"


def _missing_ground_truth(res):
    path = res / "images/ddb1_groundtruth/redsmalldots/image004.png"
    path.unlink()
    return path, "missing ground-truth map"


def _missing_fundus_mask(res):
    path = res / "images/ddb1_fundusmask/fmask.tif"
    path.unlink()
    return path, "fundus mask not found"


@pytest.mark.parametrize("corrupt", [
    _drop_fundus_images, _list_names_missing_image, _truncate_fundus_image,
    _corrupt_ground_truth, _ground_truth_wrong_size, _missing_ground_truth,
    _missing_fundus_mask])
def test_bad_input_fails_cleanly_through_the_cli(raw, tmp_path, corrupt):
    copy = tmp_path / "raw"
    shutil.copytree(raw, copy)
    victim, message = corrupt(copy / "resources")
    out = tmp_path / "out.h5"
    result = _preprocess(copy, out)
    assert_clean_failure(result, str(victim), out)
    assert message in result.stderr


def test_a_translucent_fundus_image_is_refused_and_an_opaque_alpha_dropped(tmp_path):
    """As predict refuses it: the colour under a transparent pixel is not the photograph."""
    from capsmed.data.sources.diaretdb1.layout import read_rgb_png

    rgb = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    alpha = np.full((16, 16, 1), 255, np.uint8)
    Image.fromarray(np.concatenate([rgb, alpha], axis=-1)).save(tmp_path / "a.png")
    np.testing.assert_array_equal(read_rgb_png(tmp_path / "a.png"), rgb)
    alpha[:4] = 0
    Image.fromarray(np.concatenate([rgb, alpha], axis=-1)).save(tmp_path / "a.png")
    palette = Image.new("P", (16, 16))
    palette.putpalette([0, 0, 0, 200, 100, 50])
    palette.save(tmp_path / "p.png", transparency=0)  # index 0 transparent everywhere
    # an RGB colour key (tRNS): OpenCV, so predict, reads it as alpha
    Image.fromarray(rgb).save(tmp_path / "k.png", transparency=tuple(rgb[0, 0].tolist()))
    for name in ("a.png", "p.png", "k.png"):
        with pytest.raises(CapsmedError, match=rf"{name}: has transparent pixels, but "
                                               "DIARETDB1"):
            read_rgb_png(tmp_path / name)


def test_an_animated_fundus_png_is_refused_not_read_as_its_first_frame(tmp_path):
    """As OpenCV's read (predict's) refuses it; a still one is read."""
    from capsmed.data.sources.diaretdb1.layout import read_rgb_png

    frames = [Image.fromarray(np.full((8, 8, 3), v, np.uint8)) for v in (10, 200)]
    frames[0].save(tmp_path / "still.png")
    frames[0].save(tmp_path / "loop.png", save_all=True, append_images=frames[1:])
    assert read_rgb_png(tmp_path / "still.png")[0, 0].tolist() == [10, 10, 10]
    with pytest.raises(CapsmedError, match=r"loop.png: an animation of 2 frames, not one "
                                           "fundus image"):
        read_rgb_png(tmp_path / "loop.png")


def test_a_fundus_mask_is_read_as_it_looks(tmp_path):
    """An opaque alpha channel once counted as field of view everywhere, and a
    MINISWHITE mask came back inverted; a mask held in its alpha is refused."""
    from capsmed.data.sources.diaretdb1.fundus import fundus_mask
    from capsmed.data.sources.diaretdb1.layout import read_fundus_mask

    truth = fundus_mask(40, 32)
    grey = truth.astype(np.uint8) * 255
    opaque_alpha = np.full_like(grey, 255)
    tifffile.imwrite(tmp_path / "rgba.tif", np.dstack([grey, grey, grey, opaque_alpha]),
                     photometric="rgb", extrasamples=["unassalpha"])
    tifffile.imwrite(tmp_path / "white.tif", 255 - grey, photometric="miniswhite")
    for name in ("rgba.tif", "white.tif"):
        np.testing.assert_array_equal(read_fundus_mask(tmp_path / name), truth)
    white = np.full_like(grey, 255)
    tifffile.imwrite(tmp_path / "alpha.tif", np.dstack([white, white, white, grey]),
                     photometric="rgb", extrasamples=["unassalpha"])
    with pytest.raises(CapsmedError, match=r"alpha.tif: the fundus mask has a non-uniform"):
        read_fundus_mask(tmp_path / "alpha.tif")
