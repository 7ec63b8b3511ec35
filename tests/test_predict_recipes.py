"""The training preprocessing replayed on odd files: alpha, 16 bits, options that
cannot apply (no model needed)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import tifffile

from capsmed.data.record import DatasetRecord
from capsmed.data.replay import make_recipe
from capsmed.data.replay.images import read_rgb
from capsmed.data.replay.options import Overrides
from capsmed.errors import CapsmedError

AML = DatasetRecord("aml", ("LYT", "MON"), 3, (28, 28), {"size": 28, "grey": False})
TUPAC16 = DatasetRecord("tupac16", ("non-mitosis", "mitosis"), 1, (32, 32),
                        {"patch_size": 64, "output_size": 32, "min_tissue": 0.5,
                         "h_max": 1.0})


def cell_rgba(size: int = 64) -> np.ndarray:
    """A cell on a transparent surround whose colour is black (alpha 0)."""
    rgb = np.random.default_rng(0).integers(60, 200, (size, size, 3), dtype=np.uint8)
    yy, xx = np.mgrid[:size, :size]
    alpha = np.where((yy - size / 2) ** 2 + (xx - size / 2) ** 2 < (size / 3) ** 2, 255, 0)
    alpha[:4] = 128  # and a half-transparent band
    return np.dstack([rgb * (alpha[..., None] > 0), alpha]).astype(np.uint8)


def test_an_aml_run_composites_alpha_over_white_in_every_format(tmp_path):
    rgba = cell_rgba()
    tifffile.imwrite(tmp_path / "cell.tiff", rgba, photometric="rgb", extrasamples=[2])
    cv2.imwrite(str(tmp_path / "cell.png"), rgba[..., [2, 1, 0, 3]])
    recipe = make_recipe(AML, Overrides())
    tiff, _ = recipe.convert(tmp_path / "cell.tiff")
    png, _ = recipe.convert(tmp_path / "cell.png")
    assert np.array_equal(png, tiff) and (tiff[:, -1, 0] == 255).all()  # a white corner


def test_16_bit_images_scale_alike_in_tiff_and_png(tmp_path):
    rgb16 = np.random.default_rng(1).integers(0, 65536, (32, 32, 3)).astype(np.uint16)
    tifffile.imwrite(tmp_path / "x.tif", rgb16, photometric="rgb")
    cv2.imwrite(str(tmp_path / "x.png"), rgb16[..., ::-1])
    tiff, png = read_rgb(tmp_path / "x.tif"), read_rgb(tmp_path / "x.png")
    assert np.array_equal(tiff, (rgb16 >> 8).astype(np.uint8)) and np.array_equal(png, tiff)


def test_level_and_mpp_are_refused_where_they_cannot_apply(tmp_path):
    for overrides in (Overrides(level=1), Overrides(mpp=0.5)):
        with pytest.raises(CapsmedError, match="applies to runs that read whole slides"):
            make_recipe(AML, overrides)
        image = tmp_path / "plain.png"
        cv2.imwrite(str(image), np.full((80, 80, 3), 200, np.uint8))
        with pytest.raises(CapsmedError, match="plain.png: a plain image"):
            make_recipe(TUPAC16, overrides).prepare(image, None)


def test_a_grey_png_with_alpha_stays_grey_as_training_reads_it(tmp_path):
    """OpenCV expands a grey + alpha PNG to BGRA: a colour recipe (DIARETDB1, TUPAC16)
    must refuse it as it refuses the same image without alpha, and a class folder of
    such images is grey, not RGB."""
    from PIL import Image

    from capsmed.data.sources.folder.config import FolderConfig
    from capsmed.data.sources.folder.reader import load_image

    grey = np.random.default_rng(2).integers(0, 256, (24, 24), dtype=np.uint8)
    Image.fromarray(grey).save(tmp_path / "plain.png")
    Image.fromarray(np.dstack([grey, np.full_like(grey, 200)]), "LA").save(tmp_path / "la.png")
    for name in ("plain.png", "la.png"):
        with pytest.raises(CapsmedError, match=f"{name}: expected an RGB image"):
            read_rgb(tmp_path / name)
        image, _, native, _ = load_image(tmp_path / name, None, FolderConfig())
        assert native == 1 and np.array_equal(image[0], grey), name


def test_a_translucent_image_is_refused_by_runs_whose_sets_have_no_alpha(tmp_path):
    """A digit drawn on a transparent canvas lives in its alpha channel; dropping the
    alpha gave an MNIST model a black image. An opaque alpha is dropped as before."""
    stroke = np.zeros((28, 28), np.uint8)
    stroke[6:22, 12:16] = 255
    drawn = np.dstack([np.zeros((28, 28, 3), np.uint8), stroke])  # black ink, in alpha
    cv2.imwrite(str(tmp_path / "drawn.png"), drawn)
    cv2.imwrite(str(tmp_path / "opaque.png"), np.dstack([np.dstack([stroke] * 3),
                                                         np.full_like(stroke, 255)]))
    mnist = DatasetRecord("mnist", tuple("0123456789"), 1, (28, 28), {"seed": 0})
    blood = DatasetRecord("bloodmnist", tuple("abcdefgh"), 3, (28, 28), {},
                          source_kind="medmnist")
    for record in (mnist, blood):
        recipe = make_recipe(record, Overrides())
        with pytest.raises(CapsmedError, match="drawn.png: has transparent pixels"):
            recipe.convert(tmp_path / "drawn.png")
        image, _ = recipe.convert(tmp_path / "opaque.png")
        assert np.array_equal(image[0], stroke), record.dataset


def test_a_translucent_photograph_is_refused_by_patch_runs_not_scored_as_tissue(tmp_path):
    """A TUPAC16 tile cut out on a transparent canvas: the black under its alpha read as
    dense tissue, so windows over nothing were scored. An opaque alpha is dropped."""
    rgb = np.random.default_rng(1).integers(90, 230, (96, 96, 3), dtype=np.uint8)
    alpha = np.full((96, 96), 255, np.uint8)
    alpha[:, :48] = 0
    cv2.imwrite(str(tmp_path / "cut.png"), np.dstack([rgb * (alpha[..., None] > 0),
                                                      alpha])[..., [2, 1, 0, 3]])
    tifffile.imwrite(tmp_path / "cut.tif", np.dstack([rgb, alpha]), photometric="rgb",
                     extrasamples=[2])
    cv2.imwrite(str(tmp_path / "opaque.png"), np.dstack([rgb[..., ::-1],
                                                         np.full_like(alpha, 255)]))
    cv2.imwrite(str(tmp_path / "plain.png"), rgb[..., ::-1])
    diaretdb1 = DatasetRecord("diaretdb1", ("healthy", "lesion"), 1, (28, 28),
                              {"patch_size": 32, "output_size": 28, "min_fov": 0.75,
                               "clip_limit": 3.0, "tile_grid": [8, 8]})
    for record in (TUPAC16, diaretdb1):
        recipe = make_recipe(record, Overrides())
        for name in ("cut.png", "cut.tif"):
            with pytest.raises(CapsmedError, match=f"{name}: has transparent pixels, but "
                               f"{record.dataset} images have no alpha"):
                recipe.prepare(tmp_path / name, None)
    assert np.array_equal(read_rgb(tmp_path / "opaque.png"), read_rgb(tmp_path / "plain.png"))


@pytest.mark.parametrize("overrides, message", [
    (Overrides(level=-1), "--level must be >= 0"), (Overrides(mpp=0.0), "--mpp must be"),
    (Overrides(mpp=-0.5), "--mpp must be"), (Overrides(mpp=float("nan")), "--mpp must be")])
def test_a_negative_level_or_non_positive_mpp_is_refused(overrides, message):
    """--level -1 indexed the pyramid from its end and OpenSlide read it as blank white
    windows, scored without a word; --mpp 0 divided by zero."""
    with pytest.raises(CapsmedError, match=message):
        make_recipe(TUPAC16, overrides)


def test_a_diaretdb1_centre_whose_window_reaches_past_the_image_is_refused(tmp_path):
    """DIARETDB1 training clipped its centres so every window lay inside the image; a
    given centre near the edge was cut reflect-padded (mirrored retina, never seen in
    training) and scored without a word. A TUPAC16 run pads as its training padded."""
    rgb = np.random.default_rng(2).integers(40, 200, (80, 96, 3), dtype=np.uint8)
    tifffile.imwrite(tmp_path / "fundus.tif", rgb)
    diaretdb1 = DatasetRecord("diaretdb1", ("healthy", "lesion"), 1, (28, 28),
                              {"patch_size": 32, "output_size": 28, "min_fov": 0.75,
                               "clip_limit": 3.0, "tile_grid": [8, 8]})
    recipe = make_recipe(diaretdb1, Overrides())
    inside = recipe.prepare(tmp_path / "fundus.tif", np.array([[16, 16], [80, 64]]))
    assert sum(len(c) for c, _ in inside.chunks) == 2  # windows that just fit
    for x, y in ((15, 40), (40, 15), (81, 40), (40, 65)):
        with pytest.raises(CapsmedError, match=f"fundus.tif: the 32 px window centred on "
                           f"x={x}, y={y} reaches past the 96x80 image"):
            recipe.prepare(tmp_path / "fundus.tif", np.array([[16, 16], [x, y]]))
    padded = make_recipe(TUPAC16, Overrides()).prepare(tmp_path / "fundus.tif",
                                                       np.array([[0, 0]]))
    assert sum(len(c) for c, _ in padded.chunks) == 1


def test_files_recording_an_option_that_did_nothing_are_still_replayed(tmp_path):
    """preprocess refuses options that change nothing (h_max without hematoxylin,
    unlabelled beside slide labels, an empty group pattern), but files written before
    record them: predict rebuilt the config from the record and refused every such run."""
    from dataclasses import asdict

    from capsmed.data.sources.folder.config import FolderConfig
    from capsmed.data.sources.wsi.config import WsiConfig
    from capsmed.data.sources.wsi.recipe import wsi_config

    tiles = asdict(WsiConfig(tile_size=64, output_size=28, slide_labels_csv="labels.csv"))
    tiles |= {"h_max": 2.0, "unlabelled": "drop", "background_class": "tissue"}
    wsi = DatasetRecord("wsi", ("normal", "tumor"), 3, (28, 28), tiles, source_kind="wsi")
    cfg = wsi_config(wsi, Overrides())
    assert (cfg.tile_size, cfg.slide_labels_csv, cfg.stain) == (64, "labels.csv", "none")

    photos = {**asdict(FolderConfig(channels=3, size=16)), "group_pattern": "", "classes": []}
    folder = DatasetRecord("myset", ("a", "b"), 3, (16, 16), photos, source_kind="folder")
    image = tmp_path / "x.png"
    cv2.imwrite(str(image), np.full((20, 20, 3), 90, np.uint8))
    prepared = make_recipe(folder, Overrides()).prepare(image, None)
    assert next(prepared.chunks)[0].shape == (1, 3, 16, 16)
