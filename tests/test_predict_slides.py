"""capsmed predict on whole slides and on image-level runs."""

from __future__ import annotations

import json
from types import SimpleNamespace

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
from capsmed.data.contract import read_meta
from capsmed.data.patches import extract_patches
from capsmed.data.replay import slides
from capsmed.data.sources.aml.config import AmlConfig
from capsmed.data.sources.aml.reader import preprocess_aml
from capsmed.data.sources.aml.synth import write_aml
from capsmed.data.sources.folder.config import FolderConfig
from capsmed.data.sources.folder.reader import preprocess_folder
from capsmed.data.sources.folder.synth import write_class_folders
from capsmed.data.sources.tupac16.synth import render_tupac16_image
from capsmed.data.sources.wsi.reader import WsiConfig, preprocess_wsi
from capsmed.data.sources.wsi.synth import write_pyramid, write_wsi
from capsmed.errors import CapsmedError
from capsmed.predict.config import Overrides, PredictOptions
from capsmed.predict.engine import predict
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train
from tests.test_predict import _evaluate_scores, _predicted

runner = CliRunner()


def test_a_wsi_run_predicts_the_training_tiles_of_a_slide(tmp_path):
    """Every tissue tile of the test slides, in the dataset's order: evaluate's scores."""
    paths = write_wsi(tmp_path / "syn", slides=3, size=768, seed=1, levels=2,
                      disable_progress=True)
    data = preprocess_wsi(paths, tmp_path / "w.h5", WsiConfig(
        tile_size=64, output_size=32, mask_downsample=8, workers=1, seed=0,
        slide_labels_csv=str(tmp_path / "syn" / "slide_labels.csv"),
        fractions={"train": 0.34, "val": 0.33, "test": 0.33}), disable_progress=True)
    run_dir = train(TrainConfig(data=str(data), arch="lenet", epochs=1, batch_size=16, seed=0,
                                out=str(tmp_path / "run")), disable_progress=True)
    split, expected = _evaluate_scores(run_dir, data, batch_size=64)
    slide_files = [next(p for p in paths if p.stem == s) for s in dict.fromkeys(split.groups)]
    result = predict(run_dir, slide_files, tmp_path / "out",
                     PredictOptions(batch_size=64, device="cpu"))
    assert np.array_equal(_predicted(result), expected)
    lefts = np.concatenate([r.x for r in result.results]) - 32
    assert np.array_equal(lefts, split.meta["left"])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["per_input"][0]["level"] == 0 and summary["per_input"][0]["tile_size"] == 64
    assert (tmp_path / "out" / "heatmaps" / f"slides_{slide_files[0].stem}.png").is_file()


def test_a_tupac16_run_over_a_slide_cuts_the_windows_of_the_same_image(tiny_h5, tmp_path,
                                                                       monkeypatch):
    """Read region by region (small regions here, so windows straddle several), a
    pyramidal slide gives the windows and scores of the same pixels read as one image."""
    run_dir = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                                seed=0, out=str(tmp_path / "run")), disable_progress=True)
    rgb = render_tupac16_image(np.random.default_rng(4), 512).rgb
    tifffile.imwrite(tmp_path / "image.tif", rgb)
    write_pyramid(tmp_path / "slide.svs", rgb, mpp=0.25, levels=2, tile=128)
    monkeypatch.setattr(slides, "REGION", 160)
    options = PredictOptions(device="cpu", batch_size=32, heatmaps=False)
    whole = predict(run_dir, [tmp_path / "image.tif"], tmp_path / "a", options).results[0]
    tiled = predict(run_dir, [tmp_path / "slide.svs"], tmp_path / "b", options).results[0]
    order = np.lexsort((tiled.x, tiled.y))
    assert len(whole.x) > 20 and np.array_equal(np.lexsort((whole.x, whole.y)),
                                                np.arange(len(whole.x)))
    assert np.array_equal(tiled.x[order], whole.x) and np.array_equal(tiled.y[order], whole.y)
    assert np.allclose(tiled.scores[order], whole.scores, atol=1e-6)


def test_a_folder_run_predicts_one_class_per_image(tmp_path):
    write_class_folders(tmp_path / "shapes", classes=3, images_per_class=6, patients=3,
                        size=40, seed=0, disable_progress=True)
    data = preprocess_folder(tmp_path / "shapes", tmp_path / "f.h5",
                             FolderConfig(size=32, workers=1, seed=0, fractions={
                                 "train": 0.34, "val": 0.33, "test": 0.33}),
                             disable_progress=True)
    run_dir = train(TrainConfig(data=str(data), arch="lenet", epochs=1, batch_size=8, seed=0,
                                out=str(tmp_path / "run")), disable_progress=True)
    split, expected = _evaluate_scores(run_dir, data, batch_size=512)
    files = [tmp_path / "shapes" / s for s in split.meta["source"]]
    result = predict(run_dir, files, tmp_path / "out", PredictOptions(device="cpu"))
    assert np.array_equal(_predicted(result), expected)
    assert not (tmp_path / "out" / "heatmaps").exists()  # nothing to map for whole images
    out = runner.invoke(app, ["-q", "predict", str(run_dir), str(files[0]), "-o",
                              str(tmp_path / "c"), "--centres", str(tmp_path / "x.csv")])
    assert out.exit_code == 1 and "--centres applies to patch and slide runs" in out.stderr
    for option in (["--threshold", "0.9"], ["--class", "circle"]):  # ignored, once
        out = runner.invoke(app, ["-q", "predict", str(run_dir), str(files[0]), "-o",
                                  str(tmp_path / "t"), *option])
        assert out.exit_code == 1, option
        assert "--class and --threshold apply to patch and slide runs" in out.stderr
        assert not (tmp_path / "t").exists()


def test_an_aml_run_predicts_its_held_out_fold_from_the_tiffs(tmp_path):
    """RGBA TIFFs of a cross-validation run's test fold: evaluate's scores, exactly."""

    write_aml(tmp_path / "aml", per_class_scale=0.002, size=64, seed=0, min_per_class=5,
              disable_progress=True)
    data = preprocess_aml(tmp_path / "aml", tmp_path / "aml.h5",
                          AmlConfig(size=28, workers=1), disable_progress=True)
    run_dir = train(TrainConfig(data=str(data), arch="lenet", epochs=1, batch_size=16,
                                fold=0, seed=0, out=str(tmp_path / "run")),
                    disable_progress=True)
    split, expected = _evaluate_scores(run_dir, data, batch_size=512, with_meta=False)
    rows = np.load(run_dir / "test_indices.npy")  # the held-out fold
    files = [tmp_path / "aml" / "AML-Cytomorphology" / s
             for s in read_meta(data, "all", "source", rows)]
    result = predict(run_dir, files, tmp_path / "out", PredictOptions(device="cpu"))
    assert len(files) == len(split) > 5
    assert np.array_equal(_predicted(result), expected)


def test_a_tupac16_run_warns_when_a_slide_is_read_at_another_scale(tiny_h5, tmp_path, caplog):
    run_dir = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                                seed=0, out=str(tmp_path / "run")), disable_progress=True)
    rgb = render_tupac16_image(np.random.default_rng(4), 256).rgb
    write_pyramid(tmp_path / "slide.svs", rgb, mpp=0.25, levels=2, tile=128)
    options = PredictOptions(device="cpu", heatmaps=False)
    predict(run_dir, [tmp_path / "slide.svs"], tmp_path / "a", options)
    assert "another scale" not in caplog.text  # level 0: 0.25 um/px, as TUPAC16
    predict(run_dir, [tmp_path / "slide.svs"], tmp_path / "b",
            PredictOptions(device="cpu", heatmaps=False, overrides=Overrides(level=1)))
    # the dataset named as such: a class-folder run's would read "images images"
    assert ("read at 0.5 um/px, but this run's images (dataset 'tupac16') are 0.25 um/px"
            in caplog.text)


def test_a_patch_run_refuses_mpp_on_a_slide_with_non_square_pixels(tmp_path):
    rgb = render_tupac16_image(np.random.default_rng(4), 256).rgb
    path = tmp_path / "s.tif"
    with tifffile.TiffWriter(path) as tw:  # 0.25 um/px across, 0.5 down: mean 0.375
        for i, level in enumerate((rgb, rgb[::2, ::2].copy())):
            tw.write(level, tile=(128, 128), photometric="rgb", metadata=None,
                     subfiletype=int(i > 0), resolutionunit="CENTIMETER",
                     resolution=(4e4 / 2 ** i, 2e4 / 2 ** i))
    info = slides.describe_slide(path)
    # level 1 is 0.75 um/px on their mean: it matched --mpp 0.75, and was neither
    with pytest.raises(CapsmedError, match=r"s.tif: --mpp 0.75 asked but the slide's pixels "
                                           r"are not square"):
        slides._level(info, Overrides(mpp=0.75))
    assert slides._level(info, Overrides(level=1)) == 1


@pytest.fixture(scope="module")
def wsi_run(tmp_path_factory):
    """A LeNet trained on tiles of three synthetic 0.25 um/px slides; their paths."""
    root = tmp_path_factory.mktemp("wsi-run")
    paths = write_wsi(root / "syn", slides=3, size=512, seed=1, levels=2,
                      disable_progress=True)
    data = preprocess_wsi(paths, root / "w.h5", WsiConfig(
        tile_size=64, output_size=32, mask_downsample=8, workers=1, seed=0,
        slide_labels_csv=str(root / "syn" / "slide_labels.csv"),
        fractions={"train": 0.34, "val": 0.33, "test": 0.33}), disable_progress=True)
    run_dir = train(TrainConfig(data=str(data), arch="lenet", epochs=1, batch_size=16, seed=0,
                                out=str(root / "run")), disable_progress=True)
    return run_dir, paths


def test_a_wsi_run_refuses_centres_outside_the_slide(wsi_run, tmp_path):
    run_dir, paths = wsi_run
    (tmp_path / "c.csv").write_text(f"input,x,y\n{paths[0]},100,100\n{paths[0]},5000,50\n")
    out = runner.invoke(app, ["-q", "predict", str(run_dir), str(paths[0]), "-o",
                              str(tmp_path / "out"), "--centres", str(tmp_path / "c.csv"),
                              "--device", "cpu"])
    assert out.exit_code == 1 and not (tmp_path / "out").exists()
    assert f"{paths[0]}: centre x=5000, y=50 lies outside the 512x512 slide" in out.stderr
    # inside, but its 64 px tile half off the slide: scored on white padding, it was kept
    (tmp_path / "c.csv").write_text(f"input,x,y\n{paths[0]},100,100\n{paths[0]},10,10\n")
    out = runner.invoke(app, ["-q", "predict", str(run_dir), str(paths[0]), "-o",
                              str(tmp_path / "out"), "--centres", str(tmp_path / "c.csv"),
                              "--device", "cpu"])
    assert out.exit_code == 1 and not (tmp_path / "out").exists()
    assert (f"{paths[0]}: the 64 px tile centred on x=10, y=10 reaches past the 512x512 "
            "slide") in out.stderr


def test_a_wsi_run_warns_when_a_slide_is_scanned_at_another_resolution(wsi_run, tmp_path,
                                                                        caplog):
    run_dir, paths = wsi_run
    with openslide.OpenSlide(str(paths[0])) as slide:
        rgb = np.asarray(slide.read_region((0, 0), 0, slide.dimensions).convert("RGB"))
    write_pyramid(tmp_path / "20x.svs", rgb, mpp=0.5, levels=2, tile=128)
    options = PredictOptions(device="cpu", heatmaps=False)
    predict(run_dir, [paths[0]], tmp_path / "a", options)
    assert "another scale" not in caplog.text
    predict(run_dir, [tmp_path / "20x.svs"], tmp_path / "b", options)
    said = "read at 0.5 um/px, but the run's training tiles are 0.25 um/px"
    assert said in caplog.text
    noted = json.loads((tmp_path / "b" / "summary.json").read_text())["per_input"][0]
    assert said in noted["scale_warning"] and noted["training_mpp"] == 0.25


def test_a_tupac16_slide_keeps_windows_on_pale_unsaturated_tissue(tiny_h5, tmp_path,
                                                                   monkeypatch):
    """Grey tissue (optical density over the mask's, no saturation) in whole regions of
    a slide: they are read and give the windows of the same pixels read as an image."""
    run_dir = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                                seed=0, out=str(tmp_path / "run")), disable_progress=True)
    rgb = render_tupac16_image(np.random.default_rng(4), 512).rgb.copy()
    rgb[:, :256] = np.random.default_rng(0).normal(160, 6, (512, 256, 1)).clip(0, 255)
    rgb[:, 448:] = 255  # blank glass: skipped, no window there either way
    tifffile.imwrite(tmp_path / "image.tif", rgb)
    write_pyramid(tmp_path / "slide.svs", rgb, mpp=0.25, levels=2, tile=128)
    monkeypatch.setattr(slides, "REGION", 128)
    options = PredictOptions(device="cpu", batch_size=32, heatmaps=False)
    whole = predict(run_dir, [tmp_path / "image.tif"], tmp_path / "a", options).results[0]
    tiled = predict(run_dir, [tmp_path / "slide.svs"], tmp_path / "b", options).results[0]
    assert (whole.x < 256).sum() > 5
    assert sorted(zip(tiled.x, tiled.y, strict=True)) == sorted(zip(whole.x, whole.y, strict=True))


@pytest.mark.parametrize("extra, named", [(["--stride", "16"], "--stride"),
                                          (["--min-tissue", "0.9"], "--min-tissue")])
def test_a_grid_option_with_centres_is_refused_not_ignored(wsi_run, tmp_path, extra, named):
    """--stride and --min-tissue shape a grid: with --centres the given tiles were scored
    as given and summary.json recorded the option as if it had been applied."""
    run_dir, paths = wsi_run
    (tmp_path / "c.csv").write_text(f"input,x,y\n{paths[0]},100,100\n")
    out = runner.invoke(app, ["-q", "predict", str(run_dir), str(paths[0]), "-o",
                              str(tmp_path / "out"), "--centres", str(tmp_path / "c.csv"),
                              "--device", "cpu", *extra])
    assert out.exit_code == 1 and not (tmp_path / "out").exists()
    assert (f"{tmp_path / 'c.csv'}: {named} choose the windows of a grid; with --centres "
            "the windows are the given ones") in out.stderr


def test_two_centres_on_one_pixel_of_the_level_read_are_refused_not_scored_twice(tmp_path):
    """At level 1 a pixel is 2 level-0 px: x=400 and x=401 were both read as the window
    at level-1 x=200, its row written twice to predictions.csv (and twice as a feature
    with one id in the GeoJSON)."""

    class Recipe:  # the refusal comes before anything else of the recipe is used
        size, stride = 32, 16

    rgb = np.full((256, 512, 3), 200, np.uint8)
    write_pyramid(tmp_path / "slide.svs", rgb, mpp=0.25, levels=2, tile=128)
    windows = slides.SlideWindows(Recipe(), Overrides(level=1))
    with pytest.raises(CapsmedError, match=r"slide.svs: centres x=400, y=122 and x=401, "
                       r"y=122 are one window at level 1 \(a pixel there is 2 level-0 px\)"):
        windows.prepare(tmp_path / "slide.svs", np.array([[300, 60], [400, 122], [401, 122]]))


class _RedWindows:
    """A stand-in patch recipe: 32 px windows of the red channel, all tissue."""

    size, stride = 32, 16
    record = SimpleNamespace(dataset="stand-in",
                             data_source=lambda: SimpleNamespace(scan_mpp=None))

    def min_share(self) -> float:
        return 0.5

    def channel_and_mask(self, path, rgb):
        return rgb[..., 0], np.ones(rgb.shape[:2], bool), 0.5, {}

    def cut(self, channel, xy):
        return extract_patches(channel, xy[:, ::-1], self.size)[:, None]


def test_given_centres_on_a_slide_come_back_in_the_order_given(tmp_path, monkeypatch):
    """Read region by region, a slide's given windows came back region by region, so
    predictions.csv listed them in another order than the centres CSV (and than the
    same CSV gives on the image as a plain file)."""
    rgb = np.random.default_rng(0).integers(0, 256, (256, 512, 3), dtype=np.uint8)
    write_pyramid(tmp_path / "slide.svs", rgb, mpp=0.25, levels=2, tile=128)
    with openslide.OpenSlide(str(tmp_path / "slide.svs")) as slide:
        red = np.asarray(slide.read_region((0, 0), 0, slide.dimensions))[..., 0]
    monkeypatch.setattr(slides, "REGION", 128)
    given = np.array([[400, 200], [40, 30], [300, 100], [100, 200], [450, 20]])
    prepared = slides.SlideWindows(_RedWindows(), Overrides()).prepare(
        tmp_path / "slide.svs", given)
    chunks = list(prepared.chunks)
    xy = np.concatenate([c for _, c in chunks])
    patches = np.concatenate([p for p, _ in chunks])
    assert xy.tolist() == given.tolist()
    assert np.array_equal(patches[:, 0], extract_patches(red, given[:, ::-1], 32))


def test_an_odd_wsi_tile_is_written_at_its_centre_and_read_back_from_it(tmp_path):
    """33 px tiles: ``left + 16.5`` rounded half to even put the centres of odd lefts
    1 px right of those of even ones (pixel 17 of the tile, not 16), so predictions.csv
    given back as --centres read tiles 1 px off, and the given centres x=49 and x=50
    read one tile, both written as x=50."""
    from capsmed.data.sources.wsi.recipe import SlideTiles

    rgb = np.random.default_rng(0).integers(0, 256, (150, 200, 3), dtype=np.uint8)
    write_pyramid(tmp_path / "slide.svs", rgb, mpp=0.25, levels=1, tile=128)
    recipe = SlideTiles.__new__(SlideTiles)  # the tiling alone: no run needed
    recipe.cfg = WsiConfig(tile_size=33, min_tissue=0.0, mask_downsample=8,
                           slide_labels_csv="labels.csv")
    recipe.stain, recipe.trained_mpp = None, None

    def tiles(centres):
        chunks = list(recipe.prepare(tmp_path / "slide.svs", centres).chunks)
        return (np.concatenate([t for t, _ in chunks]),
                np.concatenate([c for _, c in chunks]))

    images, xy = tiles(None)
    assert len(xy) == 6 * 4 and np.array_equal(np.unique(np.diff(np.unique(xy[:, 0]))), [33])
    for image, (x, y) in zip(images, xy.tolist(), strict=True):  # pixel 16 is the centre
        assert np.array_equal(image.transpose(1, 2, 0), rgb[y - 16:y + 17, x - 16:x + 17])
    again, back = tiles(xy)
    assert np.array_equal(back, xy) and np.array_equal(again, images)
    images, xy = tiles(np.array([[49, 60], [50, 60]]))
    assert xy.tolist() == [[49, 60], [50, 60]] and not np.array_equal(images[0], images[1])


@pytest.mark.parametrize("min_tissue", [0.8, 0.0])
def test_a_tupac16_slide_reads_every_region_holding_a_window_the_mask_keeps(
        tiny_h5, tmp_path, monkeypatch, min_tissue):
    """Dark specks on white (one black pixel in each 4x4 block) are tissue to the mask
    everywhere, but their thumbnail is pale (mean 239): the regions were skipped as
    blank for the density of the mean colour, not the most the pixels can hold, and
    with --min-tissue 0 (every window kept) a white region was skipped too. Now the
    slide gives the windows of the same pixels read as an image; white regions are
    still skipped when windows need tissue."""
    run_dir = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                                seed=0, out=str(tmp_path / "run")), disable_progress=True)
    rgb = np.full((256, 1024, 3), 255, np.uint8)
    rgb[:, :512][::4, ::4] = 0  # the left half specked, the right half blank glass
    tifffile.imwrite(tmp_path / "image.tif", rgb)
    write_pyramid(tmp_path / "slide.svs", rgb, mpp=0.25, levels=3, tile=128)
    monkeypatch.setattr(slides, "REGION", 256)
    monkeypatch.setattr(slides, "THUMBNAIL_SIDE", 256)  # 4 px per thumbnail pixel
    reads = []
    read_region = openslide.OpenSlide.read_region
    monkeypatch.setattr(openslide.OpenSlide, "read_region",
                        lambda self, *a: reads.append(a) or read_region(self, *a))
    options = PredictOptions(device="cpu", batch_size=32, heatmaps=False,
                             overrides=Overrides(min_tissue=min_tissue))
    whole = predict(run_dir, [tmp_path / "image.tif"], tmp_path / "a", options).results[0]
    tiled = predict(run_dir, [tmp_path / "slide.svs"], tmp_path / "b", options).results[0]
    assert (whole.x < 512).sum() > 10 and ((whole.x > 600).sum() > 0) == (min_tissue == 0)
    assert sorted(zip(tiled.x, tiled.y, strict=True)) == sorted(zip(whole.x, whole.y, strict=True))
    regions = [a for a in reads if a[1] == 0]  # level 0 (the thumbnail is read at 2)
    assert len(regions) == (4 if min_tissue == 0 else 3)  # the right-most one is blank
