"""Stain normalisation (Macenko, Reinhard): the estimates against known stains and
scikit-image's real IHC image, exact Beer-Lambert cases, the recorded target, and its
replay by the tupac16, wsi and folder recipes."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from skimage import color, data
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import load_split, read_info
from capsmed.data.images import read_rgb_tiff
from capsmed.data.normalise import (
    StainNormaliser,
    estimate_stain_matrix,
    lab_image,
    lab_statistics,
    load_target,
    recorded_normaliser,
)
from capsmed.data.record import DatasetRecord
from capsmed.data.replay import make_recipe
from capsmed.data.replay.options import Overrides
from capsmed.data.stains import hematoxylin_channel
from capsmed.errors import CapsmedError
from tests.helpers import assert_clean_failure

runner = CliRunner()
# Ruifrok-Johnston's stain vectors (scikit-image's rgb_from_hed), unit rows: H, E, DAB
RUIFROK = color.rgb_from_hed / np.linalg.norm(color.rgb_from_hed, axis=1, keepdims=True)


def beer_lambert(concentrations: np.ndarray, stains: np.ndarray) -> np.ndarray:
    """(H, W, 2) concentrations through unit stain vectors [2, 3] -> uint8 RGB, with
    the OD the normaliser uses: I = 256 exp(-OD) - 1."""
    od = concentrations @ stains
    return np.clip(np.rint(256.0 * np.exp(-od) - 1.0), 0, 255).astype(np.uint8)


def two_stain_concentrations(seed: int, side: int = 96) -> np.ndarray:
    """Pure hematoxylin, pure eosin and mixed pixels, stained enough that even pure
    eosin absorbs more red than Macenko's threshold (OD 0.15 in every channel)."""
    rng = np.random.default_rng(seed)
    share = rng.uniform(0, 1, (side, side, 1))
    share[: side // 4] = 1.0  # a band of pure hematoxylin
    share[-side // 4:] = 0.0  # a band of pure eosin
    amount = rng.uniform(1.5, 2.5, (side, side, 1))
    return np.concatenate([share, 1 - share], axis=-1) * amount


@pytest.fixture(scope="module")
def ihc() -> np.ndarray:
    return data.immunohistochemistry()


def hue_shifted(rgb: np.ndarray, shift: float = 0.05) -> np.ndarray:
    hsv = color.rgb2hsv(rgb)
    hsv[..., 0] = (hsv[..., 0] + shift) % 1.0
    return np.clip(np.rint(color.hsv2rgb(hsv) * 255), 0, 255).astype(np.uint8)


def lab_distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(lab_image(a) - lab_image(b)).mean())


def test_macenko_recovers_known_stain_vectors_as_unit_vectors_hematoxylin_first():
    stains = RUIFROK[:2]
    found = estimate_stain_matrix(beer_lambert(two_stain_concentrations(0), stains))
    assert np.allclose(np.linalg.norm(found, axis=1), 1.0)
    assert (found * stains).sum(axis=1).min() > 0.999  # cosine to each true vector


def test_macenko_on_h_and_e_like_tissue_is_close_to_ruifrok_johnston():
    from capsmed.data.sources.tupac16.synth import render_tupac16_image

    rgb = render_tupac16_image(np.random.default_rng(0), 512).rgb  # drawn with Ruifrok's
    found = estimate_stain_matrix(rgb)
    cosines = (found * RUIFROK[:2]).sum(axis=1)
    # every drawn tissue pixel holds some hematoxylin, so the eosin extreme is mixed
    assert cosines[0] > 0.999 and cosines[1] > 0.93


def test_macenko_on_the_real_ihc_image_finds_hematoxylin_and_dab(ihc):
    found = estimate_stain_matrix(ihc)
    assert np.allclose(np.linalg.norm(found, axis=1), 1.0)
    assert found[0] @ RUIFROK[0] > 0.99  # hematoxylin
    assert found[1] @ RUIFROK[2] > 0.99  # DAB, the brown of immunohistochemistry


def test_macenko_maps_one_staining_onto_another_exactly():
    """Source: stains S at concentrations C; target: stains T at 0.8 C. Normalising the
    source rescales C by the ratio of the 99th percentiles (0.8) and recombines with T:
    the target image, up to 8-bit rounding."""
    concentrations = two_stain_concentrations(1)
    source_stains = RUIFROK[:2]
    target_stains = np.array([[0.55, 0.75, 0.37], [0.15, 0.95, 0.27]])
    target_stains /= np.linalg.norm(target_stains, axis=1, keepdims=True)
    target_rgb = beer_lambert(0.8 * concentrations, target_stains)
    normaliser = StainNormaliser.fit("macenko", target_rgb)
    out = normaliser.apply(beer_lambert(concentrations, source_stains))
    assert np.abs(out.astype(int) - target_rgb).max() <= 3


def test_normalising_a_hue_shifted_copy_brings_it_back(ihc):
    shifted = hue_shifted(ihc)
    before = lab_distance(shifted, ihc)
    for method, most in (("reinhard", 0.7), ("macenko", 0.35)):
        after = lab_distance(StainNormaliser.fit(method, ihc).apply(shifted), ihc)
        assert after < most * before, (method, before, after)


def test_reinhard_gives_the_target_lab_statistics(ihc):
    target = hue_shifted(ihc, 0.2)
    normaliser = StainNormaliser.fit("reinhard", target)
    means, stds = lab_statistics(normaliser.apply(ihc))
    assert np.allclose(means, normaliser.target["lab_means"], atol=0.5)
    assert np.allclose(stds, normaliser.target["lab_stds"], atol=0.5)
    assert lab_distance(StainNormaliser.fit("reinhard", ihc).apply(ihc), ihc) < 0.01


def test_glass_stays_glass_and_a_stainless_target_is_refused(ihc):
    white = np.full((32, 32, 3), 255, np.uint8)
    assert np.array_equal(StainNormaliser.fit("macenko", ihc).apply(white), white)
    # Reinhard too: a blank image's mean would be moved to the tissue's (solid colour)
    assert np.array_equal(StainNormaliser.fit("reinhard", ihc).apply(white), white)
    with pytest.raises(CapsmedError, match="too little stain"):
        StainNormaliser.fit("macenko", white)



def noisy_glass(side: int = 64) -> np.ndarray:
    """Glass as a scanner gives it: near-white with a few levels of noise."""
    rng = np.random.default_rng(0)
    return np.clip(250 + rng.integers(-3, 4, (side, side, 3)), 0, 255).astype(np.uint8)


def grey_ramp(side: int = 64) -> np.ndarray:
    """An RGB image of grey levels 0..252: CIELAB a and b are rounding noise."""
    ramp = np.tile(np.arange(0, 256, 256 // side, dtype=np.uint8), (side, 1))
    return np.repeat(ramp[..., None], 3, axis=2)


@pytest.mark.parametrize("method", ["macenko", "reinhard"])
def test_noisy_glass_stays_glass(ihc, method):
    """A background patch with scanner noise had its noise scaled to the target's
    stain (Macenko: mean 165/145/136 from 250) or contrast (Reinhard: its L std of
    0.52 just passed the blank test, stretched 34-fold): glass became tissue."""
    glass = noisy_glass()
    assert np.array_equal(StainNormaliser.fit(method, ihc).apply(glass), glass)


def test_reinhard_shifts_but_does_not_scale_a_channel_without_colour(ihc):
    """A grey image's a and b (std ~0.02, rounding noise) were scaled up to the
    target's stds (4.6 and 12.6): colour noise out of a grey image."""
    normaliser = StainNormaliser.fit("reinhard", ihc)
    means, stds = lab_statistics(normaliser.apply(grey_ramp()))
    assert stds[1] < 1.0 and stds[2] < 1.0
    assert np.allclose(means[1:], normaliser.target["lab_means"][1:], atol=0.5)
    assert abs(stds[0] - normaliser.target["lab_stds"][0]) < 0.5  # L still mapped


@pytest.mark.parametrize("image", ["white", "glass", "grey"])
def test_a_blank_glass_or_colourless_reinhard_target_is_refused(image, tmp_path):
    """A white target (stds 0) turned every normalised image white, a noisy-glass one
    near-white, a grey one grey; each is refused naming the file, and so is a JSON
    target with such stds."""
    pixels = {"white": np.full((64, 64, 3), 255, np.uint8), "glass": noisy_glass(),
              "grey": grey_ramp()}[image]
    path = tmp_path / f"{image}.png"
    cv2.imwrite(str(path), pixels[..., ::-1])
    with pytest.raises(CapsmedError, match=f"{path}: its CIELAB stds are .*mostly tissue"):
        load_target("reinhard", path)
    record = tmp_path / "t.json"
    record.write_text(json.dumps({"method": "reinhard", "lab_means": [90, 0, 0],
                                  "lab_stds": [0.3, 0.02, 0.01]}))
    with pytest.raises(CapsmedError, match=f"{record}: 'lab_stds' .* blank or colourless"):
        load_target("reinhard", record)

def test_a_target_mostly_of_background_is_refused(ihc):
    """1 % tissue on glass: its 99th-percentile concentrations are near 0, and every
    image normalised to them came out white."""
    target = np.full((200, 200, 3), 245, np.uint8)
    target[:20, :20] = ihc[:20, :20]
    with pytest.raises(CapsmedError, match="mostly background"):
        StainNormaliser.fit("macenko", target, {"target": "bg.png"})


def test_a_transparent_target_counts_as_white_not_as_black_stain(ihc, tmp_path):
    """Transparent pixels of an RGBA target were read as their colour (black: the
    densest stain there is) and shifted every normalised image."""
    crop = ihc[:128, :128]
    rgba = np.zeros((256, 256, 4), np.uint8)  # transparent black around the crop
    rgba[64:192, 64:192, :3], rgba[64:192, 64:192, 3] = crop, 255
    cv2.imwrite(str(tmp_path / "rgba.png"), rgba[..., [2, 1, 0, 3]])
    on_white = np.full((256, 256, 3), 255, np.uint8)
    on_white[64:192, 64:192] = crop
    for method in ("macenko", "reinhard"):
        assert load_target(method, tmp_path / "rgba.png").target == \
            StainNormaliser.fit(method, on_white).target


def test_the_record_round_trips_through_json_and_target_files(ihc, tmp_path):
    for method in ("macenko", "reinhard"):
        fitted = StainNormaliser.fit(method, ihc)
        again = StainNormaliser.from_record(json.loads(json.dumps(fitted.to_record())))
        assert again.target == fitted.target
        assert np.array_equal(again.apply(ihc[:64, :64]), fitted.apply(ihc[:64, :64]))
    cv2.imwrite(str(tmp_path / "ref.png"), ihc[..., ::-1])
    from_image = load_target("macenko", tmp_path / "ref.png")
    assert from_image.target == StainNormaliser.fit("macenko", ihc).target
    assert from_image.origin["target"] == "ref.png"
    (tmp_path / "t.json").write_text(json.dumps(from_image.to_record()))
    assert load_target("macenko", tmp_path / "t.json").target == from_image.target


@pytest.mark.parametrize(("record", "message"), [
    ({"method": "vahadane"}, "'method' must be macenko or reinhard"),
    ({"method": "macenko", "max_concentrations": [1, 1]}, "needs 'stain_matrix'"),
    ({"method": "macenko", "stain_matrix": [[1, 0, 0], [0, 2, 0]],
      "max_concentrations": [1, 1]}, "unit vectors"),
    ({"method": "reinhard", "lab_means": [50, 0], "lab_stds": [1, 1, 1]},
     "'lab_means' must be [3] finite numbers"),
    ({"method": "reinhard", "lab_means": [50, 0, "x"], "lab_stds": [1, 1, 1]},
     "needs 'lab_means' as numbers"),
    ({"method": "reinhard", "lab_means": [50, 0, 0], "lab_stds": [0, 1, 1]},
     "'lab_stds' must be positive"),
    ({"method": "macenko", "stain_matrix": [[1, 0, 0], [0, 1, 0]],
      "max_concentrations": [0.09, -0.03]}, "'max_concentrations' must be positive"),
])
def test_malformed_targets_are_refused(record, message, tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(record))
    with pytest.raises(CapsmedError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_target(record.get("method", "macenko"), path)


def test_hand_written_targets_in_the_wrong_order_sign_or_scale_are_refused(ihc, tmp_path):
    """A target whose rows are eosin first, a negated stain vector, or Reinhard numbers
    in OpenCV's 8-bit LAB (L 0..255, a and b offset by 128) would swap the stains, turn
    the image white, or tint it: each is refused naming the file; fitted targets pass."""
    fitted = StainNormaliser.fit("macenko", ihc).to_record()
    lab8 = cv2.cvtColor(ihc, cv2.COLOR_RGB2LAB).reshape(-1, 3).astype(np.float64)
    cases = [
        ("macenko", {**fitted, "stain_matrix": fitted["stain_matrix"][::-1]},
         "hematoxylin first"),
        ("macenko", {**fitted, "stain_matrix": (-np.array(fitted["stain_matrix"])).tolist()},
         "negated vector"),
        ("reinhard", {"method": "reinhard", "lab_means": lab8.mean(0).tolist(),
                      "lab_stds": lab8.std(0).tolist()}, "8-bit LAB"),
    ]
    path = tmp_path / "t.json"
    for method, record, message in cases:
        path.write_text(json.dumps(record))
        with pytest.raises(CapsmedError, match=f"^{path}: .*{message}"):
            load_target(method, path)
    for method in ("macenko", "reinhard"):
        path.write_text(json.dumps(StainNormaliser.fit(method, ihc).to_record()))
        load_target(method, path)


def test_the_estimate_puts_the_stain_absorbing_more_red_first_after_orienting_it():
    """Stained pixels varying in colour around grey: the vectors at the extreme angles
    may point into negative OD and are flipped; hematoxylin is chosen after the flip."""
    rng = np.random.default_rng(0)
    chroma = np.array([[1, -1, 0], [1, 1, -2]]) / np.sqrt([[2], [6]])
    od = (1.0 + rng.normal(0, 1, (64 * 64, 2)) * [0.3, 0.2] @ chroma
          + rng.normal(0, 0.01, (64 * 64, 3)))
    found = estimate_stain_matrix(beer_lambert(od[:, None, :], np.eye(3)).reshape(64, 64, 3))
    assert (found.sum(axis=1) > 0).all() and found[0, 0] >= found[1, 0]


def test_images_other_than_8_bit_rgb_are_refused_not_cast(ihc):
    """A cast to uint8 would zero a float image's 0..1 and wrap 16-bit values."""
    for method in ("macenko", "reinhard"):
        normaliser = StainNormaliser.fit(method, ihc)
        for bad in (ihc / 255.0, ihc.astype(np.uint16) * 257, ihc[..., 0]):
            with pytest.raises(ValueError, match=r"needs an \(H, W, 3\) uint8 RGB"):
                normaliser.apply(bad)
            with pytest.raises(ValueError, match="uint8 RGB"):
                StainNormaliser.fit(method, bad)


def test_a_record_naming_a_method_without_its_statistics_is_refused():
    assert recorded_normaliser({"stain_norm": "none"}, "x") is None
    assert recorded_normaliser({}, "x") is None  # written before normalisation existed
    with pytest.raises(CapsmedError, match="x: stain_norm is macenko but the record"):
        recorded_normaliser({"stain_norm": "macenko"}, "x")


@pytest.fixture(scope="module")
def target_png(tmp_path_factory, ihc):
    path = tmp_path_factory.mktemp("target") / "ihc.png"
    cv2.imwrite(str(path), ihc[..., ::-1])
    return path


def test_folder_records_reinhard_and_predict_replays_it(tmp_path, target_png):
    from capsmed.data.sources.folder.config import FolderConfig
    from capsmed.data.sources.folder.reader import preprocess_folder
    from capsmed.data.sources.folder.synth import write_class_folders

    write_class_folders(tmp_path / "raw", classes=2, images_per_class=4, size=48)
    plain = preprocess_folder(tmp_path / "raw", tmp_path / "plain.h5",
                              FolderConfig(size=32, workers=1, fractions={"train": 1.0}))
    out = preprocess_folder(tmp_path / "raw", tmp_path / "norm.h5", FolderConfig(
        size=32, workers=1, fractions={"train": 1.0}, stain_norm="reinhard",
        stain_target=str(target_png)))
    info = read_info(out)
    assert info.preprocessing["stain_normalisation"]["method"] == "reinhard"
    data_split = load_split(out, "train", with_meta=True)
    assert not np.array_equal(data_split.images, load_split(plain, "train").images)
    recipe = make_recipe(DatasetRecord.from_info(info), Overrides())
    for k in (0, 5):
        image = next(recipe.prepare(tmp_path / "raw" / data_split.meta["source"][k],
                                    None).chunks)[0][0]
        assert np.array_equal(image, data_split.images[k])


def test_tupac16_normalises_each_image_before_deconvolution_and_predict_replays_it(
        tmp_path, target_png):
    from capsmed.data.sources.tupac16.config import Tupac16Config
    from capsmed.data.sources.tupac16.reader import preprocess_tupac16
    from capsmed.data.sources.tupac16.synth import write_tupac16

    write_tupac16(tmp_path / "raw", cases=2, images_per_case=1, size=256, seed=3)
    out = preprocess_tupac16(tmp_path / "raw", tmp_path / "t.h5", Tupac16Config(
        positives_per_mitosis=2, workers=1, fractions={"train": 1.0},
        allow_no_annotations=True, stain_norm="macenko", stain_target=str(target_png)))
    info = read_info(out)
    stored = load_split(out, "train", with_meta=True)
    recipe = make_recipe(DatasetRecord.from_info(info), Overrides())
    tif = tmp_path / "raw" / stored.meta["source"][0]
    rgb = read_rgb_tiff(tif)
    channel, *_ = recipe.channel_and_mask(tif, rgb)
    stain = load_target("macenko", target_png)
    assert np.array_equal(channel, hematoxylin_channel(stain.apply(rgb), info.preprocessing[
        "h_max"]))
    assert not np.array_equal(channel, hematoxylin_channel(rgb, info.preprocessing["h_max"]))
    rows = np.flatnonzero(stored.meta["source"] == stored.meta["source"][0])[:4]
    xy = np.stack([stored.meta["col"][rows], stored.meta["row"][rows]], axis=1)
    assert np.array_equal(recipe.cut(channel, xy), stored.images[rows])


def test_wsi_tiles_are_normalised_each_and_predict_replays_them(tmp_path, target_png):
    pytest.importorskip("openslide")
    from capsmed.data.sources.tupac16.synth import render_tupac16_image
    from capsmed.data.sources.wsi.config import WsiConfig
    from capsmed.data.sources.wsi.reader import preprocess_wsi
    from capsmed.data.sources.wsi.synth import write_pyramid

    slide = tmp_path / "s1.tiff"
    write_pyramid(slide, render_tupac16_image(np.random.default_rng(2), 512).rgb, mpp=0.5,
                  fmt="tiff", tile=256, levels=2)
    (tmp_path / "labels.csv").write_text("s1,tumour\n")
    out = preprocess_wsi([slide], tmp_path / "w.h5", WsiConfig(
        tile_size=64, mask_downsample=8, workers=1, fractions={"train": 1.0},
        slide_labels_csv=str(tmp_path / "labels.csv"), min_tissue=0.3,
        stain_norm="macenko", stain_target=str(target_png)))
    stored = load_split(out, "train")
    assert len(stored) >= 4
    recipe = make_recipe(DatasetRecord.from_info(read_info(out)), Overrides())
    tiles = np.concatenate([chunk for chunk, _ in recipe.prepare(slide, None).chunks])
    assert np.array_equal(tiles, stored.images)


@pytest.mark.parametrize(("args", "message"), [
    (["--stain-norm", "macenko"], "needs a target"),
    (["--stain-target", "ref.png"], "--stain-target given without a method"),
    (["--stain-norm", "vahadane", "--stain-target", "ref.png"],
     "stain_norm must be one of none, macenko, reinhard"),
    (["--stain-norm", "reinhard", "--stain-target", "ref.png", "--channels", "1"],
     "stain normalisation works on colour images"),
])
def test_the_options_are_checked_before_anything_is_read(tmp_path, args, message):
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "folder", str(tmp_path / "none"),
                                 "-o", str(out), *args])
    assert_clean_failure(result, message, out)


def test_a_grey_target_or_grey_images_are_refused_naming_the_file(tmp_path, target_png):
    from capsmed.data.sources.folder.synth import write_class_folders

    write_class_folders(tmp_path / "raw", classes=2, images_per_class=2, size=32)
    greys = sorted((tmp_path / "raw" / "circle").iterdir())
    for path in greys:
        cv2.imwrite(str(path), np.full((32, 32), 128, np.uint8))
    out = tmp_path / "out.h5"
    for target, message in ((greys[0], f"{greys[0]}: a stain target must be an RGB image"),
                            (target_png, f"{greys[0]}: a grey image; stain normalisation "
                                         "needs colour")):
        result = runner.invoke(app, ["-q", "preprocess", "folder", str(tmp_path / "raw"),
                                     "-o", str(out), "--group-pattern", "^(P\\d+)_",
                                     "--train", "1", "--val", "0", "--test", "0",
                                     "--stain-norm", "reinhard", "--stain-target",
                                     str(target)])
        assert_clean_failure(result, message, out)



def test_a_grey_image_copied_into_rgb_by_channels_3_is_refused(tmp_path, target_png):
    """--channels 3 copies a grey file into RGB before normalisation, which then
    painted it in the target's stain colours (exit 0): the file itself is checked."""
    from capsmed.data.sources.folder.synth import write_class_folders

    write_class_folders(tmp_path / "raw", classes=2, images_per_class=2, size=32)
    grey = sorted((tmp_path / "raw" / "circle").iterdir())[0]
    cv2.imwrite(str(grey), np.tile(np.arange(0, 256, 8, dtype=np.uint8), (32, 1)))
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "folder", str(tmp_path / "raw"),
                                 "-o", str(out), "--group-pattern", "^(P\\d+)_",
                                 "--train", "1", "--val", "0", "--test", "0",
                                 "--channels", "3", "--stain-norm", "macenko",
                                 "--stain-target", str(target_png)])
    assert_clean_failure(result, f"{grey}: a grey image; stain normalisation needs "
                                 "colour", out)

def test_a_mostly_background_target_is_refused_through_the_cli(tmp_path, ihc):
    """The in-process refusal above, as a user meets it: one line naming the target
    file, exit 1, no dataset file."""
    from capsmed.data.sources.folder.synth import write_class_folders

    write_class_folders(tmp_path / "raw", classes=2, images_per_class=2, size=32)
    target = np.full((200, 200, 3), 245, np.uint8)
    target[:20, :20] = ihc[:20, :20]
    cv2.imwrite(str(tmp_path / "bg.png"), target[..., ::-1])
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "folder", str(tmp_path / "raw"),
                                 "-o", str(out), "--group-pattern", "^(P\\d+)_",
                                 "--train", "1", "--val", "0", "--test", "0",
                                 "--stain-norm", "macenko", "--stain-target",
                                 str(tmp_path / "bg.png")])
    assert_clean_failure(result, str(tmp_path / "bg.png"), out)
    assert "mostly background" in result.stderr
