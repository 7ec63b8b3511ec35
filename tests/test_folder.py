"""Class-folder source: synthetic folders -> HDF5, grouping, conversions, splits, bad input."""

from __future__ import annotations

import unicodedata

import cv2
import numpy as np
import pytest
import tifffile
from typer.testing import CliRunner

import capsmed.data.sources.folder.reader as folder_source
from capsmed.cli import app
from capsmed.data.contract import class_counts, groups_by_split, load_split, read_info
from capsmed.data.sources.folder.reader import FolderConfig, discover, preprocess_folder
from capsmed.data.sources.folder.synth import write_class_folders
from capsmed.errors import CapsmedError
from tests.helpers import assert_clean_failure

runner = CliRunner()
PATIENT = r"^(P\d+)_"


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """3 classes (circle, square, triangle) x 8 RGB PNGs of 40x40 over 4 patients."""
    root = tmp_path_factory.mktemp("folder") / "shapes"
    write_class_folders(root, classes=3, images_per_class=8, patients=4, size=40, seed=2)
    return root


def _splits(path):
    return {s: load_split(path, s, with_meta=True) for s in read_info(path).split_sizes}


def _write(path, image):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix in (".tif", ".tiff"):
        tifffile.imwrite(path, image)
    else:
        assert cv2.imwrite(str(path), image)


def test_synth_layout(raw):
    names, files = discover(raw)
    assert names == ["circle", "square", "triangle"]
    assert len(files) == 24
    assert {f.rel.split("/")[0] for f in files} == set(names)
    assert {f.path.name[:4] for f in files} == {"P01_", "P02_", "P03_", "P04_"}
    assert [f.label for f in files] == [0] * 8 + [1] * 8 + [2] * 8


def test_counts_groups_and_pixels(raw, tmp_path):
    out = preprocess_folder(raw, tmp_path / "d.h5", FolderConfig(group_pattern=PATIENT,
                                                                 workers=1))
    info = read_info(out)
    assert info.class_names == ("circle", "square", "triangle")
    assert (info.channels, info.image_size) == (3, (40, 40))
    assert info.dataset == "shapes" and info.preprocessing["grouping"] == "group_pattern"
    assert sum(class_counts(out).values()).tolist() == [8, 8, 8]
    groups = groups_by_split(out)
    assert set().union(*groups.values()) == {"P01", "P02", "P03", "P04"}
    assert sum(len(g) for g in groups.values()) == 4  # no patient in two splits
    for data in _splits(out).values():
        for k in range(len(data)):
            src = data.meta["source"][k]
            assert src.split("/")[1].startswith(data.groups[k] + "_")
            bgr = cv2.imread(str(raw / src))
            np.testing.assert_array_equal(data.images[k], bgr[..., ::-1].transpose(2, 0, 1))
            assert data.meta["source_height"][k] == 40


def test_classes_option_chooses_and_orders(raw, tmp_path):
    cfg = FolderConfig(classes=("triangle", "circle"), fractions={"train": 1.0}, workers=1)
    data = _splits(preprocess_folder(raw, tmp_path / "d.h5", cfg))["train"]
    assert read_info(tmp_path / "d.h5").class_names == ("triangle", "circle")
    assert np.bincount(data.labels).tolist() == [8, 8]
    for label, src in zip(data.labels, data.meta["source"], strict=True):
        assert src.startswith("triangle/" if label == 0 else "circle/")
    # without a pattern or CSV every image is its own group
    assert len(set(data.groups)) == 16


def test_groups_csv_nested_folders_and_hidden_files(raw, tmp_path):
    root = tmp_path / "root"
    for name, value in (("a", 50), ("b", 200)):
        for i in range(3):
            _write(root / name / "sub" / f"img{i}.PNG", np.full((8, 8), value + i, np.uint8))
        _write(root / name / ".hidden.png", np.zeros((8, 8), np.uint8))
        _write(root / name / ".cache" / "x.png", np.zeros((8, 8), np.uint8))
        (root / name / "notes.txt").write_text("not an image")
    (root / ".git").mkdir()
    lines = ["file,group"] + [f"./{n}/sub/img{i}.PNG,{'X' if i < 2 else 'Y'}"
                              for n in "ab" for i in range(3)]
    (tmp_path / "groups.csv").write_text("\n".join(lines) + "\n")
    cfg = FolderConfig(groups_csv=str(tmp_path / "groups.csv"), split_files={
        "train": str(tmp_path / "train.txt"), "test": str(tmp_path / "test.txt")}, workers=1)
    (tmp_path / "train.txt").write_text("X\n")
    (tmp_path / "test.txt").write_text("Y  # the held-out patient\n")
    splits = _splits(preprocess_folder(root, tmp_path / "d.h5", cfg))
    assert read_info(tmp_path / "d.h5").class_names == ("a", "b")
    assert splits["train"].meta["source"].tolist() == ["a/sub/img0.PNG", "a/sub/img1.PNG",
                                                       "b/sub/img0.PNG", "b/sub/img1.PNG"]
    assert splits["test"].groups.tolist() == ["Y", "Y"]
    assert splits["test"].images[:, 0, 0, 0].tolist() == [52, 202]
    assert splits["train"].images.shape[1:] == (1, 8, 8)  # grey in, grey out


def test_channels_and_size_conversion(raw, tmp_path):
    cfg = FolderConfig(channels=1, size=20, fractions={"train": 1.0}, workers=1)
    data = _splits(preprocess_folder(raw, tmp_path / "d.h5", cfg))["train"]
    assert data.images.shape == (24, 1, 20, 20)
    rgb = cv2.imread(str(raw / data.meta["source"][5]))[..., ::-1]
    grey = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2GRAY)
    expected = cv2.resize(grey, (20, 20), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(data.images[5, 0], expected)

    wide = tmp_path / "wide"
    _write(wide / "a" / "x.png", np.full((20, 40), 200, np.uint8))  # 20 high, 40 wide
    _write(wide / "b" / "y.png", np.full((40, 40), 100, np.uint8))
    cfg = FolderConfig(channels=3, size=16, keep_aspect=True, fractions={"train": 1.0},
                       workers=1)
    data = _splits(preprocess_folder(wide, tmp_path / "w.h5", cfg))["train"]
    assert data.images.shape == (2, 3, 16, 16)
    column = data.images[0, 1, :, 8]  # fitted to 8 high x 16 wide, padded top and bottom
    assert column.tolist() == [0] * 4 + [200] * 8 + [0] * 4
    assert (data.images[1] == 100).all()
    assert data.meta["source_height"].tolist() == [20, 40]
    assert data.meta["source_width"].tolist() == [40, 40]


def test_16bit_and_rgba_input(tmp_path):
    root = tmp_path / "deep"
    ramp = np.array([[0, 257 * 100, 65535, 1000]], np.uint16).repeat(4, 0)
    _write(root / "png16" / "a.png", ramp)
    _write(root / "tif16" / "b.tif", ramp)
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0], rgba[..., 2], rgba[..., 3] = 10, 250, 7  # BGRA on disk: B=10, R=250
    _write(root / "rgba" / "c.png", rgba)
    cfg = FolderConfig(channels=3, fractions={"train": 1.0}, workers=1)
    data = _splits(preprocess_folder(root, tmp_path / "full.h5", cfg))["train"]
    image = dict(zip(data.meta["source"], data.images, strict=True))
    for src in ("png16/a.png", "tif16/b.tif"):  # 0..65535 -> 0..255
        assert image[src][0, 0].tolist() == [0, 100, 255, 4]
    assert image["rgba/c.png"][:, 0, 0].tolist() == [250, 0, 10]  # RGB, alpha dropped

    low = np.array([[1000, 2000, 3000, 1500]], np.uint16).repeat(4, 0)  # a 12-bit sensor
    _write(root / "low16" / "d.tif", low)
    cfg = FolderConfig(channels=1, classes=("low16",), fractions={"train": 1.0}, workers=1)
    data = _splits(preprocess_folder(root, tmp_path / "dark.h5", cfg))["train"]
    assert data.images[0, 0, 0].tolist() == [4, 8, 12, 6]  # full range: round(v / 257)
    cfg = FolderConfig(channels=1, scale16="minmax", classes=("low16",),
                       fractions={"train": 1.0}, workers=1)
    data = _splits(preprocess_folder(root, tmp_path / "mm.h5", cfg))["train"]
    assert data.images[0, 0, 0].tolist() == [0, 128, 255, 64]  # own 1000..3000 -> 0..255


def test_tiff_colour_interpretations_are_read_as_they_look(tmp_path):
    """Palette, MINISWHITE and planar TIFFs give the pixels a viewer shows, not their
    raw samples; CMYK is refused (its 4th sample is not alpha)."""
    from capsmed.data.images import read_image

    truth = np.zeros((8, 8, 3), np.uint8)
    truth[:, 4:] = 255  # left black, right white
    index = (truth[..., 0] == 0).astype(np.uint8)  # palette entry 1 = black
    colormap = np.zeros((3, 256), np.uint16)
    colormap[:, 0] = 65535
    written = {
        "palette.tif": (index, {"photometric": "palette", "colormap": colormap}),
        "miniswhite.tif": (255 - truth[..., 0], {"photometric": "miniswhite"}),
        "planar.tif": (np.moveaxis(truth, -1, 0), {"photometric": "rgb",
                                                   "planarconfig": "separate"}),
    }
    for name, (data, options) in written.items():
        tifffile.imwrite(tmp_path / name, data, **options)
        image = read_image(tmp_path / name)
        got = image if image.ndim == 2 else image[..., 0]
        assert got.astype(np.int64).tolist() == (truth[..., 0].astype(np.int64)
                                                * (65535 // 255 if got.dtype == np.uint16
                                                   else 1)).tolist(), name
    cmyk = np.zeros((8, 8, 4), np.uint8)
    tifffile.imwrite(tmp_path / "cmyk.tif", cmyk, photometric="separated")
    with pytest.raises(CapsmedError, match="cmyk.tif: a TIFF with CMYK colours"):
        read_image(tmp_path / "cmyk.tif")


def test_tiff_of_fewer_than_8_bits_is_scaled_to_full_range(tmp_path):
    """A 4-bit grey TIFF's 15 is white, as Pillow and viewers show it, not almost black."""
    from PIL import Image

    from capsmed.data.images import read_image

    ramp = np.tile(np.arange(16, dtype=np.uint8), (4, 1))
    for bits, kind in ((4, "minisblack"), (4, "miniswhite"), (2, "minisblack")):
        path = tmp_path / f"{kind}{bits}.tif"
        tifffile.imwrite(path, ramp % (1 << bits), bitspersample=bits, photometric=kind)
        assert read_image(path).tolist() == np.asarray(Image.open(path)).tolist(), path.name
    assert read_image(tmp_path / "minisblack4.tif").max() == 255


def test_tiff_of_12_bits_is_scaled_to_full_range(tmp_path):
    """A 12-bit TIFF's 4095 is white (its BitsPerSample says so), not 16 of 255, in a
    folder run and in the TUPAC16/AML readers' ``v >> 8`` alike."""
    from capsmed.data.images import read_image, read_rgb_tiff, to_uint8

    ramp = np.array([[0, 1365, 2730, 4095]], np.uint16).repeat(4, 0)
    tifffile.imwrite(tmp_path / "grey12.tif", ramp, bitspersample=12)
    tifffile.imwrite(tmp_path / "rgb12.tif", np.dstack([ramp] * 3), bitspersample=12,
                     photometric="rgb")
    path = tmp_path / "grey12.tif"
    assert to_uint8(read_image(path), "full", path)[0].tolist() == [0, 85, 170, 255]
    assert read_rgb_tiff(tmp_path / "rgb12.tif")[0, :, 1].tolist() == [0, 85, 170, 255]


def test_a_tiff_stack_is_refused_not_read_as_its_first_page(tmp_path):
    """A 3-channel ImageJ TIFF (a page per channel) is not its first channel in grey;
    a reduced-resolution page (a pyramid, a thumbnail) is no stack."""
    from capsmed.data.images import read_image

    rgb = np.zeros((16, 16, 3), np.uint8)
    rgb[..., 0], rgb[..., 2] = 200, 50
    tifffile.imwrite(tmp_path / "channels.tif", np.moveaxis(rgb, -1, 0), imagej=True,
                     metadata={"axes": "CYX"})
    with pytest.raises(CapsmedError, match=r"channels.tif: a stack of 3 TIFF pages"):
        read_image(tmp_path / "channels.tif")
    # a TIFF by another name is a TIFF: OpenCV would read its first page alone
    (tmp_path / "channels.png").write_bytes((tmp_path / "channels.tif").read_bytes())
    with pytest.raises(CapsmedError, match=r"channels.png: a stack of 3 TIFF pages"):
        read_image(tmp_path / "channels.png")
    with tifffile.TiffWriter(tmp_path / "pyramid.tif") as tif:
        tif.write(rgb, metadata=None)
        tif.write(rgb[::2, ::2], subfiletype=1, metadata=None)
    assert np.array_equal(read_image(tmp_path / "pyramid.tif"), rgb)


def test_an_animation_is_refused_not_read_as_its_first_frame(tmp_path):
    """An animated PNG in a class folder (or a GIF given to predict) is a cine loop, not
    its first frame, as a TIFF stack is not its first page; a still one is read."""
    from PIL import Image

    from capsmed.data.images import read_image

    frames = [Image.fromarray(np.full((6, 6, 3), v, np.uint8)) for v in (10, 200, 90)]
    root = tmp_path / "loops"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        frames[0].save(root / name / "P0_still.png")
    frames[0].save(root / "b" / "P1_loop.png", save_all=True, append_images=frames[1:])
    frames[0].save(tmp_path / "loop.gif", save_all=True, append_images=frames[1:])
    with pytest.raises(CapsmedError, match=r"P1_loop.png: an animation of 3 frames"):
        preprocess_folder(root, tmp_path / "p.h5",
                          FolderConfig(fractions={"train": 1.0}, workers=1))
    with pytest.raises(CapsmedError, match=r"loop.gif: an animation of 3 frames"):
        read_image(tmp_path / "loop.gif")
    assert read_image(root / "a" / "P0_still.png")[0, 0].tolist() == [10, 10, 10]


def test_exif_orientation_is_counted_in_a_warning(tmp_path, caplog):
    from PIL import Image

    root = tmp_path / "photos"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        image = Image.fromarray(np.full((8, 12, 3), 100, np.uint8))
        exif = Image.Exif()
        exif[0x0112] = 6 if name == "a" else 1  # a: turned 90 degrees; b: upright
        image.save(root / name / "P0_x.jpg", exif=exif)
    with caplog.at_level("WARNING"):
        out = preprocess_folder(root, tmp_path / "p.h5",
                                FolderConfig(fractions={"train": 1.0}, workers=1))
    assert read_info(out).image_size == (8, 12)  # stored as the pixels lie
    assert "1 image(s) carry an EXIF orientation (P0_x.jpg) that is not applied" \
        in caplog.text
    # a TIFF's own orientation tag (274), which tifffile ignores and viewers apply
    tifffile.imwrite(root / "b" / "P1_y.tif", np.full((8, 12, 3), 100, np.uint8),
                     photometric="rgb", extratags=[(274, "H", 1, 6, True)])
    caplog.clear()
    with caplog.at_level("WARNING"):
        preprocess_folder(root, tmp_path / "q.h5",
                          FolderConfig(fractions={"train": 1.0}, workers=1))
    assert "2 image(s) carry an EXIF orientation (P0_x.jpg, P1_y.tif)" in caplog.text


def test_colour_turned_grey_by_a_grey_first_image_is_warned_about(tmp_path, caplog):
    root = tmp_path / "mixed"
    _write(root / "a" / "0_grey.png", np.full((8, 8), 90, np.uint8))
    for i in range(2):
        _write(root / "a" / f"{i + 1}_colour.png", np.full((8, 8, 3), (10, 200, 60), np.uint8))
    cfg = FolderConfig(fractions={"train": 1.0}, workers=1)
    with caplog.at_level("WARNING"):
        out = preprocess_folder(root, tmp_path / "grey.h5", cfg)
    assert read_info(out).channels == 1
    assert "2 colour image(s) converted to grey because the first image (a/0_grey.png)" \
        in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        preprocess_folder(root, tmp_path / "rgb.h5", FolderConfig(
            channels=3, fractions={"train": 1.0}, workers=1))
    assert "converted to grey" not in caplog.text


def test_folds_are_stratified_and_keep_patients_together(tmp_path):
    root = tmp_path / "shapes"
    write_class_folders(root, classes=3, images_per_class=12, patients=6, size=24, seed=4)
    cfg = FolderConfig(group_pattern=PATIENT, folds=3, seed=1, workers=1)
    data = _splits(preprocess_folder(root, tmp_path / "f.h5", cfg))
    assert list(data) == ["all"]
    info = read_info(tmp_path / "f.h5")
    assert info.folds == {"all": 3}
    folds, labels, groups = data["all"].folds, data["all"].labels, data["all"].groups
    for g in set(groups):
        assert len(set(folds[groups == g])) == 1, g
    per_fold = np.zeros((3, 3), int)
    np.add.at(per_fold, (folds, labels), 1)
    assert per_fold.sum(0).tolist() == [12, 12, 12]
    assert per_fold.sum(1).tolist() == [12, 12, 12]  # 6 patients x 2 images per class each
    assert (per_fold == 4).all()


@pytest.mark.slow
def test_deterministic_and_workers_agree(raw, tmp_path, monkeypatch):
    cfg = FolderConfig(group_pattern=PATIENT, size=16, seed=7, workers=1)
    a = _splits(preprocess_folder(raw, tmp_path / "a.h5", cfg))
    b = _splits(preprocess_folder(raw, tmp_path / "b.h5", cfg))
    monkeypatch.setattr(folder_source, "FILES_PER_JOB", 5)  # several jobs for the pool
    c = _splits(preprocess_folder(raw, tmp_path / "c.h5",
                                  FolderConfig(group_pattern=PATIENT, size=16, seed=7,
                                               workers=2)))
    assert a.keys() == b.keys() == c.keys()
    for split in a:
        for other in (b, c):
            np.testing.assert_array_equal(a[split].images, other[split].images)
            np.testing.assert_array_equal(a[split].labels, other[split].labels)
            assert a[split].meta["source"].tolist() == other[split].meta["source"].tolist()
    other_seed = groups_by_split(preprocess_folder(
        raw, tmp_path / "d.h5", FolderConfig(group_pattern=PATIENT, seed=8, workers=1)))
    assert other_seed != groups_by_split(tmp_path / "a.h5")


def test_cli_synth_and_preprocess(tmp_path):
    result = runner.invoke(app, ["-q", "synth", "folder", str(tmp_path / "raw"), "--classes",
                                 "2", "--images-per-class", "4", "--patients", "2", "--size",
                                 "24"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == ["circle", "square"]
    result = runner.invoke(app, ["-q", "preprocess", "folder", str(tmp_path / "raw"), "-o",
                                 str(tmp_path / "d.h5"), "--group-pattern", PATIENT,
                                 "--channels", "1", "--size", "12", "--folds", "2",
                                 "--workers", "1", "--name", "demo"])
    assert result.exit_code == 0, result.output
    info = read_info(tmp_path / "d.h5")
    assert (info.dataset, info.channels, info.image_size) == ("demo", 1, (12, 12))
    assert info.split_sizes == {"all": 8} and info.folds == {"all": 2}
    # issue 12 item 24: `data info` showed "source: ?" (the root was recorded as "root")
    result = runner.invoke(app, ["data", "info", str(tmp_path / "d.h5")])
    assert f"source: {(tmp_path / 'raw').resolve()} (8 files" in " ".join(result.output.split())


# ---- bad input through the real CLI -----------------------------------------------




def _good(root):
    for name in ("a", "b"):
        for i in range(2):
            _write(root / name / f"P{i}_x.png", np.full((8, 8), 60 * i, np.uint8))


def _corrupt_png(root):
    victim = root / "a" / "P0_x.png"
    victim.write_bytes(victim.read_bytes()[:30])
    return victim, "cannot decode image"


def _corrupt_tiff(root):
    victim = root / "b" / "P9_bad.tif"
    victim.write_bytes(b"II*\x00garbage")
    return victim, "cannot read TIFF"


def _empty_class(root):
    (root / "c").mkdir()
    (root / "c" / "readme.txt").write_text("no images here")
    return root / "c", "holds no images"


def _no_class_folders(root):
    for p in sorted(root.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    (root / "x.png").write_bytes(b"")
    return root, "no class folders"


def _size_mismatch(root):
    victim = root / "b" / "P5_big.png"
    _write(victim, np.zeros((9, 8), np.uint8))
    return victim, "pass a size"


def _same_stem(root):  # one image twice: it could land in train and in test
    victim = root / "a" / "P0_x.PNG"
    _write(root / "a" / "P0_x.tmp.png", np.zeros((8, 8), np.uint8))
    (root / "a" / "P0_x.tmp.png").rename(victim)
    return victim, "also present as"


def _classes_differ_in_case(root):
    _write(root / "A" / "P7_x.png", np.zeros((8, 8), np.uint8))
    return root, "'A' and 'a' differ only in case"


def _classes_differ_in_unicode_form(root):  # NFC and NFD: two classes shown alike
    _write(root / unicodedata.normalize("NFC", "Patient \u00c4") / "P7_x.png",
           np.zeros((8, 8), np.uint8))
    _write(root / unicodedata.normalize("NFD", "Patient \u00c4") / "P8_x.png",
           np.zeros((8, 8), np.uint8))
    return root, "differ only in case or Unicode form"


def _class_named_total(root):  # report.csv's total row: two rows of that name
    _write(root / "Total" / "P7_x.png", np.zeros((8, 8), np.uint8))
    return root / "Total", "has the name of the reports' total row"


def _tiff_stack(root):  # three channels as pages: one image would be read as three
    victim = root / "b" / "P1_y.tif"
    channels = np.zeros((3, 8, 8), np.uint8)
    channels[0] = 200
    tifffile.imwrite(victim, channels, imagej=True, metadata={"axes": "CYX"})
    return victim, "a stack of 3 TIFF pages (axes CYX, shape 3x8x8), not one image"


def _cmyk_tiff(root):
    victim = root / "b" / "P1_y.tif"
    tifffile.imwrite(victim, np.zeros((8, 8, 4), np.uint8), photometric="separated")
    return victim, "a TIFF with CMYK colours cannot be read as RGB or grey"


def _unread_format(root):  # a WebP is neither read nor may it vanish unsaid
    victim = root / "b" / "P3_x.webp"
    victim.write_bytes(b"RIFF\0\0\0\0WEBPVP8 ")
    return victim, "a WEBP image, a format the folder source does not read"


@pytest.mark.parametrize("break_it", [_corrupt_png, _corrupt_tiff, _empty_class,
                                      _no_class_folders, _size_mismatch, _same_stem,
                                      _classes_differ_in_case,
                                      _classes_differ_in_unicode_form, _unread_format,
                                      _class_named_total, _tiff_stack, _cmyk_tiff])
def test_bad_raw_data(tmp_path, break_it):
    root = tmp_path / "root"
    _good(root)
    victim, message = break_it(root)
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "folder", str(root), "-o", str(out),
                                 "--workers", "1", "--group-pattern", PATIENT, "--train",
                                 "1", "--val", "0", "--test", "0"])
    assert_clean_failure(result, str(victim), out)
    assert message in result.stderr


def test_missing_root_and_unknown_class(tmp_path):
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["preprocess", "folder", str(tmp_path / "nope"), "-o",
                                 str(out)])
    assert_clean_failure(result, str(tmp_path / "nope"), out)
    _good(tmp_path / "root")
    result = runner.invoke(app, ["preprocess", "folder", str(tmp_path / "root"), "-o",
                                 str(out), "--classes", "a,zebra"])
    assert_clean_failure(result, str(tmp_path / "root" / "zebra"), out)


@pytest.mark.parametrize("rows, names, message", [
    (["a/P0_x.png,1", "a/P1_x.png,1", "b/P0_x.png,2", "b/gone.png,2"], "groups.csv",
     "b/gone.png does not exist"),
    (["a/P0_x.png,1", "a/P1_x.png,1", "b/P0_x.png,2"], "P1_x.png", "not listed in"),
])
def test_bad_groups_csv(tmp_path, rows, names, message):
    _good(tmp_path / "root")
    (tmp_path / "groups.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["preprocess", "folder", str(tmp_path / "root"), "-o",
                                 str(out), "--groups-csv", str(tmp_path / "groups.csv")])
    assert_clean_failure(result, names, out)
    assert message in result.stderr


NFC_NAME, NFD_NAME = (unicodedata.normalize(f, "M\u00fcller") for f in ("NFC", "NFD"))


@pytest.mark.parametrize("how", ["pattern", "csv"])
def test_groups_differing_only_in_unicode_form_are_refused(tmp_path, how):
    """One patient's files named in NFC (made on Linux) and NFD (copied from macOS) were
    two groups: the patient could sit in train and test while 'no group leak' held."""
    root = tmp_path / "root"
    for name, patient in (("a", NFC_NAME), ("b", NFD_NAME), ("a", "Zoe"), ("b", "Zoe")):
        _write(root / name / f"{patient}_x.png", np.zeros((8, 8), np.uint8))
    options = ["--group-pattern", r"^(.+)_x"]
    if how == "csv":
        (tmp_path / "groups.csv").write_text("".join(
            f"{p.relative_to(root).as_posix()},{p.name.split('_')[0]}\n"
            for p in sorted(root.rglob("*.png"))), encoding="utf-8")
        options = ["--groups-csv", str(tmp_path / "groups.csv")]
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "folder", str(root), "-o", str(out),
                                 "--workers", "1", *options])
    assert_clean_failure(result, "'M\\xfcller' and 'Mu\\u0308ller' differ only in "
                         "Unicode form", out)


def test_file_not_matching_group_pattern(tmp_path):
    _good(tmp_path / "root")
    _write(tmp_path / "root" / "b" / "scan7.png", np.zeros((8, 8), np.uint8))
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["preprocess", "folder", str(tmp_path / "root"), "-o",
                                 str(out), "--group-pattern", PATIENT])
    assert_clean_failure(result, str(tmp_path / "root" / "b" / "scan7.png"), out)
    assert "does not match the group pattern" in result.stderr


def test_config_errors():
    with pytest.raises(CapsmedError, match="one capture group"):
        folder_source.assign_groups(None, [], FolderConfig(group_pattern=r"P\d+"))
    with pytest.raises(CapsmedError, match="sum to 1"):
        FolderConfig(fractions={"train": 0.8, "test": 0.1})
    with pytest.raises(CapsmedError, match="exclude each other"):
        FolderConfig(folds=3, split_files={"train": "t.txt"})


def test_classes_option_finds_a_folder_named_in_another_unicode_form(tmp_path):
    nfd = unicodedata.normalize("NFD", "lésion")  # as a folder copied from macOS names it
    for name in (nfd, "sain"):
        _write(tmp_path / name / "x.png", np.zeros((8, 8), np.uint8))
    names, files = discover(tmp_path, ("lésion",))  # typed in NFC
    assert names == [nfd] and [f.rel for f in files] == [f"{nfd}/x.png"]  # kept as stored
