"""Whole-slide images: synthetic pyramids, tissue tiling, levels/mpp, labels, bad input."""

from __future__ import annotations

import json
from dataclasses import replace

import cv2
import numpy as np
import pytest
import tifffile
from typer.testing import CliRunner

try:  # openslide-python imports fine but raises if the C library cannot be loaded
    import openslide
except (ImportError, OSError) as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"openslide cannot load its C library ({exc}); install openslide-bin",
                allow_module_level=True)

from capsmed.cli import app
from capsmed.data.contract import groups_by_split, load_split, read_info
from capsmed.data.sources.wsi import annotations as ann
from capsmed.data.sources.wsi import tile_labels
from capsmed.data.sources.wsi.reader import (
    WsiConfig,
    choose_resolution,
    describe_slide,
    grid_edges,
    open_slide,
    preprocess_wsi,
    tissue_fractions,
    tissue_mask,
)
from capsmed.data.sources.wsi.synth import render_slide, write_pyramid
from capsmed.data.splits import split_groups
from capsmed.data.stains import hematoxylin_channel
from capsmed.errors import CapsmedError
from tests.helpers import assert_clean_failure

runner = CliRunner()
PINK = (205, 120, 190)
BLOCK_A = (256, 256, 640, 512)  # x0, y0, x1, y1: 3 x 2 whole 128-px tiles
BLOCK_B = (768, 640, 832, 768)  # covers half of the tile at (768, 640)
TILES_A = {(x, y) for x in (256, 384, 512) for y in (256, 384)}


def _image(blocks, size=1024, seed=0):
    rng = np.random.default_rng(seed)
    rgb = np.clip(rng.normal(246, 2, (size, size, 3)), 0, 255).astype(np.uint8)  # glass
    for x0, y0, x1, y1 in blocks:
        rgb[y0:y1, x0:x1] = np.clip(rng.normal(PINK, 4, (y1 - y0, x1 - x0, 3)), 0, 255)
    return rgb


def _slide(path, blocks=(BLOCK_A,), mpp=0.5, fmt="svs", size=1024, seed=0):
    write_pyramid(path, _image(blocks, size, seed), mpp=mpp, fmt=fmt, tile=256, levels=3)
    return path


def _labels_csv(path, rows):
    path.write_text("".join(f"{r}\n" for r in rows))
    return path


def _cfg(**kw):
    base = {"tile_size": 128, "mask_downsample": 8, "workers": 1,
            "fractions": {"train": 1.0}}
    return WsiConfig(**{**base, **kw})


def _all(path):
    return {s: load_split(path, s, with_meta=True) for s in read_info(path).split_sizes}


def _coords(split):
    return {(int(x), int(y)) for x, y in zip(split.meta["left"], split.meta["top"], strict=True)}


def test_synthetic_slides_are_pyramids_openslide_reads(tmp_path):
    result = runner.invoke(app, ["-q", "synth", "wsi", str(tmp_path / "syn"), "--slides", "2",
                                 "--size", "1024", "--seed", "1"])
    assert result.exit_code == 0, result.output
    root = tmp_path / "syn"
    slide = openslide.OpenSlide(root / "slides" / "slide_001.svs")
    assert slide.level_count == 3
    assert slide.level_dimensions == ((1024, 1024), (512, 512), (256, 256))
    assert slide.properties["openslide.vendor"] == "aperio"
    assert float(slide.properties["openslide.mpp-x"]) == 0.25
    assert slide.properties["openslide.objective-power"] == "40"
    assert "thumbnail" in slide.associated_images
    # the annotations describe the drawn slide (render is the first use of the rng)
    truth = render_slide(np.random.default_rng([1, 1]), 1024, tumour=True)
    assert np.array_equal(np.asarray(slide.read_region((0, 0), 0, (1024, 1024)))[..., :3],
                          truth.rgb)
    polygons = ann.read_geojson(root / "annotations" / "slide_001.geojson")
    assert polygons and {p.label for p in polygons} == {"Tumor"}
    assert ann.read_geojson(root / "annotations" / "slide_002.geojson") == []
    points = ann.read_points_csv(root / "points.csv", {"slide_001": "a", "slide_002": "b"})
    for (x, y), label in zip(points["a"].xy.astype(int), points["a"].labels, strict=True):
        assert truth.tissue[y, x] and truth.tumour[y, x] == (label == "tumor")
    assert set(points["b"].labels) == {"stroma"}
    assert (root / "slide_labels.csv").read_text().splitlines()[1:] == [
        "slide_001,tumor", "slide_002,normal"]

    # the whole chain on them: polygon labels, Tumor tiles only where the tumour is drawn
    out = tmp_path / "syn.h5"
    result = runner.invoke(app, ["-q", "preprocess", "wsi", str(root / "slides"), "-o",
                                 str(out), "--geojson", str(root / "annotations"),
                                 "--tile-size", "64", "--workers", "1", "--train", "0.5",
                                 "--val", "0", "--test", "0.5"])
    assert result.exit_code == 0, result.output
    info = read_info(out)
    assert info.class_names == ("Tumor", "background")
    assert info.source["slides"]["slide_002"]["level_downsamples"] == [1.0, 2.0, 4.0]
    tumour_tiles = 0
    for split in _all(out).values():
        for s, x, y, label in zip(split.groups, split.meta["left"], split.meta["top"],
                                  split.labels, strict=True):
            if label == 0:
                assert s == "slide_001" and truth.tumour[y + 32, x + 32]
                tumour_tiles += 1
    assert tumour_tiles >= 3


def test_a_16_bit_grey_plain_image_is_refused_not_clipped_to_white(tmp_path):
    """Pillow's fallback slide reader clips 16-bit grey at 255: a ramp read as nearly all
    white. An 8-bit image of the same ramp reads as itself."""
    from capsmed.data.slides import on_white, open_slide

    ramp = np.tile(np.linspace(0, 65535, 64).astype(np.uint16), (64, 1))
    cv2.imwrite(str(tmp_path / "deep.png"), ramp)
    cv2.imwrite(str(tmp_path / "flat.png"), (ramp >> 8).astype(np.uint8))
    tifffile.imwrite(tmp_path / "deep.tif", ramp)
    for name in ("deep.png", "deep.tif"):
        with pytest.raises(CapsmedError, match=f"{name}: a 16-bit grey plain image"):
            open_slide(tmp_path / name)
    with open_slide(tmp_path / "flat.png") as slide:
        rgb = on_white(slide.read_region((0, 0), 0, (64, 64)))
    assert np.array_equal(rgb[..., 1], (ramp >> 8).astype(np.uint8))


def test_generic_tiff_pyramid_reports_mpp_from_resolution_tags(tmp_path):
    info = describe_slide(_slide(tmp_path / "g.tiff", fmt="tiff", mpp=0.5))
    assert info.vendor == "generic-tiff" and info.mpp == 0.5
    assert info.level_downsamples == (1.0, 2.0, 4.0)
    no_mpp = describe_slide(_slide(tmp_path / "n.tiff", fmt="tiff", mpp=None))
    assert no_mpp.mpp is None and no_mpp.vendor == "generic-tiff"


@pytest.mark.parametrize("min_tissue, extra", [(0.4, {(768, 640)}), (0.6, set())])
def test_tiles_are_the_tissue_tiles(tmp_path, min_tissue, extra):
    path = _slide(tmp_path / "a.svs", blocks=(BLOCK_A, BLOCK_B))
    labels = _labels_csv(tmp_path / "l.csv", ["a,x"])
    out = preprocess_wsi([path], tmp_path / "o.h5",
                         _cfg(min_tissue=min_tissue, slide_labels_csv=str(labels)))
    split = _all(out)["train"]
    assert _coords(split) == TILES_A | extra
    assert set(split.meta["level"]) == {0}
    np.testing.assert_allclose(split.meta["tissue"][:6], 1.0, atol=0.02)
    # stored pixels are exactly the slide's pixels at that position
    x, y = int(split.meta["left"][0]), int(split.meta["top"][0])
    region = np.asarray(openslide.OpenSlide(path).read_region((x, y), 0, (128, 128)))
    np.testing.assert_array_equal(split.images[0], region[..., :3].transpose(2, 0, 1))


def test_tissue_fractions_match_a_direct_count_on_a_synthetic_slide():
    truth = render_slide(np.random.default_rng(5), 1024, tumour=True)
    cfg = _cfg(slide_labels_csv="x", tile_size=100, stride=75)
    mask, threshold = tissue_mask(cv2.resize(truth.rgb, (128, 128),
                                             interpolation=cv2.INTER_AREA), cfg)
    assert threshold >= cfg.min_saturation
    # the Otsu mask agrees with the drawn tissue on >= 97% of the thumbnail
    drawn = cv2.resize(truth.tissue.astype(np.uint8), (128, 128),
                       interpolation=cv2.INTER_AREA) > 0.5
    assert (mask == drawn).mean() > 0.97
    res = choose_resolution(_info_like(mpp=0.25), _cfg(slide_labels_csv="x", mpp=0.6,
                                                           tile_size=100, stride=75))
    xs, ys = grid_edges(1024, res, cfg), grid_edges(1024, res, cfg)
    fp = res.footprint(100)
    assert np.allclose(np.diff(xs), 75 * 2.4, atol=1) and xs[-1] + fp <= 1024
    frac = tissue_fractions(mask, (1024, 1024), xs, ys, fp)
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            x0, y0 = round(x / 8), round(y / 8)
            x1, y1 = round((x + fp) / 8), round((y + fp) / 8)
            assert frac[i, j] == pytest.approx(mask[y0:y1, x0:x1].mean())


def test_mask_cleanup_removes_specks_and_fills_holes_but_not_the_surroundings():
    img = np.full((60, 60, 3), 248, np.uint8)
    img[10:40, 10:40] = PINK  # 900 px of tissue ...
    img[20:23, 20:23] = 248  # ... with a 9-px hole
    img[50:52, 50:52] = PINK  # a 4-px speck
    mask, _ = tissue_mask(img, _cfg(slide_labels_csv="x", mask_blur=1))
    assert mask.sum() == 900 and mask[21, 21] and not mask[50, 50]
    kept, _ = tissue_mask(img, _cfg(slide_labels_csv="x", mask_blur=1, min_object_area=0,
                                    max_hole_area=0))
    assert kept.sum() == 900 - 9 + 4


def _info_like(mpp):
    from capsmed.data.sources.wsi.reader import SlideInfo

    return SlideInfo(path="s.svs", slide_id="s", reader="OpenSlide", vendor="aperio",
                     dimensions=(1024, 1024), level_dimensions=((1024, 1024), (512, 512),
                                                                (256, 256)),
                     level_downsamples=(1.0, 2.0, 4.0), mpp=mpp, mpp_xy=(mpp, mpp),
                     objective_power=None, file_size=0, quickhash=None)


@pytest.mark.parametrize("mpp, level, downsample, read", [
    (0.5, 0, 1.0, 64), (1.0, 1, 2.0, 64), (1.004, 1, 2.0, 64), (1.5, 1, 3.0, 96),
    (2.0, 2, 4.0, 64), (3.0, 2, 6.0, 96)])
def test_mpp_picks_the_finest_level_that_needs_no_upsampling(mpp, level, downsample, read):
    res = choose_resolution(_info_like(0.5), _cfg(slide_labels_csv="x", mpp=mpp,
                                                     tile_size=64))
    assert (res.level, res.read_size) == (level, read)
    assert res.downsample == pytest.approx(downsample)


def test_mpp_finer_than_level_0_or_level_out_of_range_is_refused():
    with pytest.raises(CapsmedError, match="finer than the slide's level 0"):
        choose_resolution(_info_like(0.5), _cfg(slide_labels_csv="x", mpp=0.25))
    with pytest.raises(CapsmedError, match="level 3 asked but the slide has 3 level"):
        choose_resolution(_info_like(0.5), _cfg(slide_labels_csv="x", level=3))


def test_mpp_on_a_slide_with_non_square_pixels_is_refused_not_read_at_their_mean(tmp_path):
    # 0.25 um/px across, 0.5 down: --mpp 0.5 read 85 px squares of level 0 (their mean
    # 0.375 um/px), tiles of 0.33 x 0.66 um/px recorded as 0.5
    path = tmp_path / "a.tif"
    with tifffile.TiffWriter(path) as tw:
        for level in (_image(()), _image((), size=512)):
            tw.write(level, tile=(256, 256), photometric="rgb", metadata=None,
                     subfiletype=0 if len(level) == 1024 else 1, resolutionunit="CENTIMETER",
                     resolution=(4e4 * len(level) / 1024, 2e4 * len(level) / 1024))
    info = describe_slide(path)
    assert info.mpp_xy == (0.25, 0.5)
    with pytest.raises(CapsmedError, match=r"a.tif: --mpp 0.5 asked but the slide's pixels "
                                           r"are not square \(0.25 x 0.5 um/px\)"):
        choose_resolution(info, _cfg(slide_labels_csv="x", mpp=0.5))
    # within 1%: square; --level reads pixels as they are
    near = replace(_info_like(0.25), mpp_xy=(0.25, 0.2512), mpp=0.2506)
    assert choose_resolution(near, _cfg(slide_labels_csv="x", mpp=0.5)).level == 1
    assert choose_resolution(info, _cfg(slide_labels_csv="x", level=1)).level == 1


def test_level_1_and_mpp_give_level_0_coordinates_scaled_by_the_downsample(tmp_path):
    path = _slide(tmp_path / "a.svs")
    labels = str(_labels_csv(tmp_path / "l.csv", ["a,x"]))
    by_level = _all(preprocess_wsi([path], tmp_path / "l1.h5", _cfg(
        level=1, tile_size=64, slide_labels_csv=labels)))["train"]
    assert _coords(by_level) == TILES_A  # 64 px at level 1 = 128 px at level 0
    assert set(by_level.meta["level"]) == {1} and by_level.images.shape[1:] == (3, 64, 64)
    x, y = int(by_level.meta["left"][0]), int(by_level.meta["top"][0])
    region = np.asarray(openslide.OpenSlide(path).read_region((x, y), 1, (64, 64)))
    np.testing.assert_array_equal(by_level.images[0], region[..., :3].transpose(2, 0, 1))

    by_mpp = preprocess_wsi([path], tmp_path / "m.h5", _cfg(
        mpp=1.0, tile_size=64, slide_labels_csv=labels))
    np.testing.assert_array_equal(_all(by_mpp)["train"].images, by_level.images)
    resampled = preprocess_wsi([path], tmp_path / "r.h5", _cfg(
        mpp=1.5, tile_size=64, output_size=32, slide_labels_csv=labels, min_tissue=0.6))
    split = _all(resampled)["train"]
    assert split.images.shape[1:] == (3, 32, 32) and set(split.meta["level"]) == {1}
    assert (split.meta["left"] % 192 == 0).all() and (split.meta["top"] % 192 == 0).all()
    # 192-px cells: (384, 192) and (384, 384) are 2/3 block A; (192, *) only 4/9
    assert _coords(split) == {(384, 192), (384, 384)}
    stats = read_info(resampled).preprocessing["per_slide"]["a"]
    assert (stats["level"], stats["read_size"], stats["mpp"]) == (1, 96, 1.5)


def test_point_labels_land_on_the_tiles_that_hold_them(tmp_path, caplog):
    path = _slide(tmp_path / "a.svs")
    csv = _labels_csv(tmp_path / "p.csv", [
        "label,slide,x,y",  # a header: columns by name, in any order
        "tumor,a.svs,300,300", "stroma,a,400,300",
        "stroma,a,520,392", "tumor,a,570,450",  # same tile: the point nearer its centre wins
        "tumor,a,900,900"])  # on glass: no tile
    with caplog.at_level("WARNING"):
        out = preprocess_wsi([path], tmp_path / "p.h5", _cfg(points_csv=str(csv)))
    assert "1 of 5 point annotation(s) fall on no kept tile" in caplog.text
    info, split = read_info(out), _all(out)["train"]
    assert info.class_names == ("background", "stroma", "tumor")
    got = {(int(x), int(y)): int(k) for x, y, k in zip(split.meta["left"], split.meta["top"],
                                                       split.labels, strict=True)}
    assert got == {(256, 256): 2, (384, 256): 1, (512, 384): 2,
                   (512, 256): 0, (256, 384): 0, (384, 384): 0}
    stats = info.preprocessing["per_slide"]["a"]
    assert stats["points_on_no_tile"] == 1 and stats["tiles_with_two_point_classes"] == 1
    dropped = preprocess_wsi([path], tmp_path / "d.h5", _cfg(points_csv=str(csv),
                                                             unlabelled="drop"))
    assert read_info(dropped).class_names == ("stroma", "tumor")
    assert _coords(_all(dropped)["train"]) == {(256, 256), (384, 256), (512, 384)}


def _feature(geometry, name=None, kind="annotation"):
    props = {"objectType": kind}
    if name:
        props["classification"] = {"name": name, "color": [200, 0, 0]}
    return {"type": "Feature", "geometry": geometry, "properties": props}


def _rect(x0, y0, x1, y1):
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]


def test_polygon_labels_follow_centres_nesting_holes_and_skip_non_annotations(tmp_path):
    path = _slide(tmp_path / "a.svs")
    features = [
        _feature({"type": "Polygon", "coordinates": [_rect(250, 250, 500, 340)]}, "Tumor"),
        _feature({"type": "Polygon", "coordinates": [_rect(430, 300, 470, 340)]}, "Necrosis"),
        _feature({"type": "MultiPolygon", "coordinates": [
            [_rect(250, 380, 700, 520), _rect(420, 420, 480, 480)]]}, "Stroma"),
        _feature({"type": "Polygon", "coordinates": [_rect(0, 0, 1024, 1024)]}, "Cell",
                 kind="detection"),
        _feature({"type": "Polygon", "coordinates": [_rect(0, 0, 1024, 1024)]}),  # unclassified
        _feature({"type": "Point", "coordinates": [300, 300]}, "Tumor"),
    ]
    folder = tmp_path / "geo"
    folder.mkdir()
    (folder / "a.svs.geojson").write_text(json.dumps(  # QuPath's <image name>.geojson
        {"type": "FeatureCollection", "features": features}))
    out = preprocess_wsi([path], tmp_path / "g.h5", _cfg(geojson=(str(folder),)))
    info, split = read_info(out), _all(out)["train"]
    assert info.class_names == ("Necrosis", "Stroma", "Tumor", "background")
    got = {(int(x), int(y)): info.class_names[k] for x, y, k in
           zip(split.meta["left"], split.meta["top"], split.labels, strict=True)}
    assert got == {(256, 256): "Tumor", (384, 256): "Necrosis", (512, 256): "background",
                   (256, 384): "Stroma", (384, 384): "background", (512, 384): "Stroma"}
    # the plain-array export (no FeatureCollection) reads the same polygons
    (tmp_path / "array.json").write_text(json.dumps(features))
    assert [p.label for p in ann.read_geojson(tmp_path / "array.json")] == [
        "Tumor", "Necrosis", "Stroma"]


def test_polygon_overlap_share_and_qupath_class_forms():
    poly = ann.Polygon("T", np.array(_rect(0, 0, 30, 100), float)[:-1], (), 3000.0)
    boxes, index = np.array([[0, 0]]), {"T": 0}
    assert tile_labels.polygon_labels(boxes, 100, (poly,), index, None).tolist() == [-1]  # centre
    assert tile_labels.polygon_labels(boxes, 100, (poly,), index, 0.25).tolist() == [0]
    assert tile_labels.polygon_labels(boxes, 100, (poly,), index, 0.3).tolist() == [-1]
    assert ann._class_name({"names": ["Tumor", "Positive"], "color": [1, 2, 3]}) == \
        "Tumor: Positive"
    assert ann._class_name({"name": "Positive", "colorRGB": -1,
                            "parentClass": {"name": "Tumor", "colorRGB": -2}}) == \
        "Tumor: Positive"
    assert ann._class_name("Stroma") == "Stroma" and ann._class_name(None) is None


@pytest.mark.slow
def test_slides_at_other_mpp_at_the_chosen_level_are_refused_not_mixed(tmp_path):
    # a 40x and a 20x scan tiled at level 0: tiles of two physical scales in one dataset
    fine, coarse = _slide(tmp_path / "a.svs", mpp=0.25, size=768), \
        _slide(tmp_path / "b.svs", mpp=0.5, size=768)
    labels = str(_labels_csv(tmp_path / "l.csv", ["a,x", "b,y"]))
    out = tmp_path / "w.h5"
    result = runner.invoke(app, ["-q", "preprocess", "wsi", str(fine), str(coarse), "-o",
                                 str(out), "--slide-labels", labels, "--workers", "1"])
    assert_clean_failure(result, f"{coarse}: 0.5 um/px at level 0, but {fine} is 0.25 um/px "
                         "there", out)
    assert "--mpp 0.5" in result.stderr
    with pytest.raises(CapsmedError, match=r"b.svs: 1 um/px at level 1, but .*a.svs is 0.5 um/px"):
        preprocess_wsi([fine, coarse], out, _cfg(level=1, slide_labels_csv=labels))
    # one scale asked for: each slide read (or resampled) to it
    both = preprocess_wsi([fine, coarse], out, _cfg(mpp=0.5, slide_labels_csv=labels))
    per_slide = read_info(both).preprocessing["per_slide"]
    assert {s: v["mpp"] for s, v in per_slide.items()} == {"a": 0.5, "b": 0.5}
    # within the 1% a level match allows, and a slide without mpp metadata: as before
    near = _slide(tmp_path / "c.svs", mpp=0.252, size=768)
    unknown = _slide(tmp_path / "d.svs", mpp=None, size=768)
    labels = str(_labels_csv(tmp_path / "n.csv", ["a,x", "c,y", "d,y"]))
    preprocess_wsi([fine, near, unknown], tmp_path / "n.h5", _cfg(slide_labels_csv=labels))


def _svs_with_power_only(path, power, size=768, seed=0):
    """An Aperio file with AppMag and no MPP: OpenSlide reports the power, no mpp."""
    rgb = _image(((128, 128, 640, 640),), size, seed)
    half = cv2.resize(rgb, (size // 2, size // 2), interpolation=cv2.INTER_AREA)
    with tifffile.TiffWriter(path) as tw:
        for head, level in ((f"{size}x{size} [0,0 {size}x{size}] (256x256) Deflate", rgb),
                            (f"{size}x{size} -> {size // 2}x{size // 2} - ", half)):
            tw.write(level, tile=(256, 256), photometric="rgb", metadata=None,
                     description=f"Aperio Image Library v12.0.15 \r\n{head}|AppMag = {power}")
    return path


def test_slides_without_mpp_at_other_objective_powers_are_refused_not_mixed(tmp_path):
    # a 40x and a 20x scan that give no mpp, only their power, tiled at level 0: they
    # were not compared, and their tiles went into one dataset at two scales
    a, b = _svs_with_power_only(tmp_path / "a.svs", 40), \
        _svs_with_power_only(tmp_path / "b.svs", 20)
    assert (describe_slide(a).mpp, describe_slide(a).objective_power) == (None, "40")
    labels = str(_labels_csv(tmp_path / "l.csv", ["a,x", "b,y"]))
    with pytest.raises(CapsmedError, match=r"b.svs: objective power 20x at level 0, but "
                                           r".*a.svs is 40x there"):
        preprocess_wsi([a, b], tmp_path / "o.h5", _cfg(slide_labels_csv=labels))
    # one power at the level, or a slide with mpp at 40x: as before
    c = _svs_with_power_only(tmp_path / "c.svs", 40, seed=1)
    preprocess_wsi([a, c, _slide(tmp_path / "d.svs", mpp=0.25, size=768)],
                   tmp_path / "w.h5", _cfg(slide_labels_csv=str(_labels_csv(
                       tmp_path / "m.csv", ["a,x", "c,y", "d,y"]))))


def test_slide_labels_split_by_slide_and_workers_give_identical_files(tmp_path):
    for i in range(5):
        _slide(tmp_path / f"s{i}.svs", size=768, seed=i)
    csv = _labels_csv(tmp_path / "labels.csv", ["slide,label"] + [
        f"s{i},{'tumor' if i % 2 else 'normal'}" for i in range(5)])
    fractions = {"train": 0.6, "val": 0.2, "test": 0.2}
    cfg = _cfg(slide_labels_csv=str(csv), fractions=fractions, seed=3, tiles_per_job=4)
    one = preprocess_wsi([tmp_path], tmp_path / "one.h5", cfg)  # a folder of slides
    groups = groups_by_split(one)
    assert not (groups["train"] & groups["val"] or groups["train"] & groups["test"]
                or groups["val"] & groups["test"])
    expected = split_groups([f"s{i}" for i in range(5)], fractions, 3)
    for split, data in _all(one).items():
        assert {expected[g] for g in data.groups} == {split}
        names = [read_info(one).class_names[k] for k in data.labels]
        assert names == ["tumor" if int(g[1]) % 2 else "normal" for g in data.groups]
        assert len(data) == 6 * len(set(data.groups))
    two = preprocess_wsi([tmp_path], tmp_path / "two.h5", replace(cfg, workers=2))
    for split, data in _all(one).items():
        other = load_split(two, split, with_meta=True)
        np.testing.assert_array_equal(other.images, data.images)
        np.testing.assert_array_equal(other.labels, data.labels)
        np.testing.assert_array_equal(other.meta["left"], data.meta["left"])


def test_split_files_assign_slides_and_must_name_known_slides(tmp_path):
    for seed, name in enumerate(("p", "q", "r")):  # three slides, not one copied
        _slide(tmp_path / f"{name}.svs", size=768, seed=seed)
    csv = str(_labels_csv(tmp_path / "l.csv", ["p,x", "q,y", "r,x"]))
    train = _labels_csv(tmp_path / "train.txt", ["p", "# a comment", "r"])
    test = _labels_csv(tmp_path / "test.txt", ["q"])
    cfg = _cfg(slide_labels_csv=csv, split_files={"train": str(train), "test": str(test)})
    out = preprocess_wsi([tmp_path], tmp_path / "s.h5", cfg)
    assert groups_by_split(out) == {"train": {"p", "r"}, "test": {"q"}}
    assert read_info(out).preprocessing["splits"] == {"p": "train", "q": "test", "r": "train"}
    test.write_text("q\nghost\n")
    with pytest.raises(CapsmedError, match="not in the data: ghost"):
        preprocess_wsi([tmp_path], tmp_path / "t.h5", cfg)


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_plain_images_go_through_imageslide(tmp_path, suffix):
    rgb = _image((BLOCK_A,))
    path = tmp_path / f"a{suffix}"
    if suffix == ".png":
        cv2.imwrite(str(path), rgb[..., ::-1])
    else:
        tifffile.imwrite(path, rgb, photometric="rgb")  # stripped, not tiled: not OpenSlide's
    assert type(open_slide(path)).__name__ == "ImageSlide"
    csv = _labels_csv(tmp_path / "l.csv", ["a,x"])
    out = preprocess_wsi([path], tmp_path / "p.h5", _cfg(slide_labels_csv=str(csv),
                                                         stain="hematoxylin"))
    split = _all(out)["train"]
    assert _coords(split) == TILES_A and split.images.shape[1:] == (1, 128, 128)
    x, y = int(split.meta["left"][0]), int(split.meta["top"][0])
    np.testing.assert_array_equal(split.images[0, 0],
                                  hematoxylin_channel(rgb[y:y + 128, x:x + 128]))
    info = read_info(out).source["slides"]["a"]
    assert info["reader"] == "ImageSlide" and info["mpp"] is None




def _text_svs(tmp_path):
    bad = tmp_path / "slides" / "broken.svs"
    bad.write_text("this is not a slide\n")
    return [str(tmp_path / "slides")], bad, "cannot open slide"


def _unknown_slide_in_csv(tmp_path):
    csv = _labels_csv(tmp_path / "p.csv", ["slide,x,y,label", "a,300,300,tumor",
                                           "ghost,10,10,tumor"])
    return [str(tmp_path / "slides"), "--labels-csv", str(csv)], csv, \
        "line 3: slide 'ghost' is not among the input slides"


def _invalid_geojson(tmp_path):
    geo = tmp_path / "a.geojson"
    geo.write_text('{"type": "FeatureCollection", "features": [')
    return [str(tmp_path / "slides"), "--geojson", str(geo)], geo, "not valid JSON"


def _mpp_without_metadata(tmp_path):
    png = tmp_path / "plain.png"
    cv2.imwrite(str(png), _image((BLOCK_A,)))
    return [str(png), "--mpp", "0.5"], png, "no microns-per-pixel metadata"


def _point_outside_slide(tmp_path):
    csv = _labels_csv(tmp_path / "p.csv", ["a,5000,10,tumor"])
    return [str(tmp_path / "slides"), "--labels-csv", str(csv)], csv, \
        "line 1: point (5000, 10) is outside slide a (1024x1024"


def _polygon_at_another_scale(tmp_path):  # x10: every tile would silently be background
    geo = tmp_path / "a.geojson"
    geo.write_text(json.dumps({"type": "FeatureCollection", "features": [
        _feature({"type": "Polygon", "coordinates": [_rect(250, 250, 500, 340)]}, "Tumor"),
        _feature({"type": "Polygon", "coordinates": [_rect(2500, 2500, 5000, 3400)]},
                 "Tumor")]}))
    return [str(tmp_path / "slides"), "--geojson", str(geo)], geo, \
        "polygon 2 ('Tumor') spans x 2500..5000, y 2500..3400, outside slide a (1024x1024"


@pytest.mark.parametrize("make", [_text_svs, _unknown_slide_in_csv, _invalid_geojson,
                                  _mpp_without_metadata, _point_outside_slide,
                                  _polygon_at_another_scale],
                         ids=["text-file-named-svs", "csv-unknown-slide", "invalid-geojson",
                              "mpp-without-metadata", "point-outside-slide",
                              "polygon-outside-slide"])
def test_bad_input_fails_cleanly_through_the_cli(tmp_path, make):
    (tmp_path / "slides").mkdir()
    _slide(tmp_path / "slides" / "a.svs")
    args, victim, message = make(tmp_path)
    if "--labels-csv" not in args and "--geojson" not in args:
        args += ["--slide-labels", str(_labels_csv(tmp_path / "sl.csv", ["a,x", "plain,x",
                                                                        "broken,x"]))]
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "wsi", *args, "-o", str(out),
                                 "--workers", "1"])
    assert_clean_failure(result, str(victim), out)
    assert message in result.stderr



def test_tiles_narrower_than_a_mask_pixel_take_the_mask_pixel_under_them():
    """8-px tiles on a 16-px mask: rounding gave a tile its right-hand neighbour's mask
    pixel, so a glass tile left of the tissue was kept and the tissue's last tile was not."""
    mask = np.zeros((8, 8), bool)
    mask[:, 2:4] = True  # level-0 x 32..64 at mask_downsample 16
    xs = np.arange(0, 128, 8)
    frac = tissue_fractions(mask, (128, 128), xs, np.array([0]), 8.0)[0]
    assert xs[frac == 1].tolist() == [32, 40, 48, 56] and set(frac) == {0.0, 1.0}
    # 12-px tiles: each takes the mask pixel holding most of it
    xs = np.arange(0, 120, 12)
    frac = tissue_fractions(mask, (128, 128), xs, np.array([0]), 12.0)[0]
    assert xs[frac == 1].tolist() == [36, 48]


def test_a_slide_without_points_is_warned_about_like_one_without_geojson(tmp_path, caplog):
    """Every tile of a slide the points CSV leaves out became background, unannounced
    (a slide without a GeoJSON was already warned about)."""
    csv = _labels_csv(tmp_path / "p.csv", ["a,300,300,tumor"])
    with caplog.at_level("WARNING"):
        labelling = tile_labels.load_labels(_cfg(points_csv=str(csv)),
                                            {"a": (1024, 1024), "b": (1024, 1024)}, {})
    assert labelling.per_slide["b"].points is None
    assert f"b: no point in {csv} for this slide; all its tiles are unlabelled" in caplog.text
    assert "a: no point" not in caplog.text


def test_tiles_that_fit_the_slide_exactly_are_all_kept():
    """896 px at 0.2 um/px tiled at 0.28 um/px, 64 px: 640 px, ten tiles. The division
    gives 639.99999999999989, which lost the last column to the floor."""
    from capsmed.data.slides import Resolution

    res = Resolution(level=0, downsample=0.28 / 0.2, read_size=90, mpp=0.28)
    edges = grid_edges(896, res, _cfg(slide_labels_csv="x", tile_size=64))
    assert len(edges) == 10 and edges[-1] + res.footprint(64) <= 896 + 1e-6
    assert len(grid_edges(89, res, _cfg(slide_labels_csv="x", tile_size=64))) == 0



def test_qupath_0_2_cells_and_detections_named_by_feature_id_are_not_annotations(tmp_path):
    """QuPath before 0.3 wrote no objectType; the feature's id said what an object was.
    Its classified cells and detections were read as annotations and, being the
    smallest polygons, labelled the tiles under them."""
    def legacy(kind, rect, name):
        return {"type": "Feature", "id": kind, "geometry": {"type": "Polygon",
                                                            "coordinates": [_rect(*rect)]},
                "properties": {"classification": {"name": name, "colorRGB": -1},
                               "isLocked": False, "measurements": []}}

    path = tmp_path / "a.json"
    path.write_text(json.dumps([
        legacy("PathAnnotationObject", (0, 0, 500, 500), "Tumor"),
        legacy("PathCellObject", (10, 10, 20, 20), "Lymphocyte"),
        legacy("PathDetectionObject", (30, 30, 40, 40), "Stroma"),
        {**legacy("PathAnnotationObject", (0, 0, 9, 9), "Necrosis"),
         "id": "6f1c2d2e-0000-4000-8000-000000000000"}]))  # 0.3+: a UUID, objectType absent
    assert [p.label for p in ann.read_geojson(path)] == ["Tumor", "Necrosis"]


@pytest.mark.parametrize("suffix", [".svs", ".png"])
def test_one_slide_given_twice_under_two_names_is_refused(tmp_path, suffix):
    """A copied slide (or two files of one DICOM series) became two slides, its tiles
    written twice and, split by slide, in train and test."""
    folder = tmp_path / "slides"
    folder.mkdir()
    if suffix == ".svs":
        _slide(folder / "a.svs", size=768)
    else:
        cv2.imwrite(str(folder / "a.png"), _image((BLOCK_A,), size=768)[..., ::-1])
    _slide(folder / "b.svs", size=768, seed=1)
    (folder / f"a_rescan{suffix}").write_bytes((folder / f"a{suffix}").read_bytes())
    csv = str(_labels_csv(tmp_path / "l.csv", ["a,x", "a_rescan,x", "b,y"]))
    cfg = _cfg(slide_labels_csv=csv, fractions={"train": 0.5, "test": 0.5})
    with pytest.raises(CapsmedError, match=rf"a_rescan{suffix}: the same slide as .*a{suffix}"):
        preprocess_wsi([folder], tmp_path / "c.h5", cfg)
    assert not (tmp_path / "c.h5").exists()
