"""TUPAC16 preprocessing on synthetic data in the official and flattened layouts."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from capsmed.data.contract import groups_by_split, load_split, read_info
from capsmed.data.patches import extract_patches, resize_patches
from capsmed.data.sources.tupac16.reader import (
    Tupac16Config,
    discover,
    preprocess_tupac16,
    read_mitosis_csv,
    read_rgb_tiff,
)
from capsmed.data.sources.tupac16.synth import render_tupac16_image
from capsmed.data.stains import hematoxylin_channel, hematoxylin_density
from capsmed.errors import CapsmedError


def _all_splits(path):
    info = read_info(path)
    return {s: load_split(path, s, with_meta=True) for s in info.split_sizes}


def test_discovery_reads_official_layout(tiny_raw):
    records = discover(tiny_raw)
    assert len(records) == 10
    assert {r.case for r in records} == {"01", "02", "03", "04", "05"}
    assert all(r.tif.parent.parent.name == "mitoses_image_data_part_1" for r in records)
    with_gt = [r for r in records if r.csv is not None]
    assert with_gt and all("mitoses_ground_truth" in r.csv.parts for r in with_gt)
    assert all(len(r.mitoses) == 0 for r in records if r.csv is None)


def test_positives_are_centred_on_the_csv_coordinates(tiny_raw, tiny_h5):
    cfg = Tupac16Config()
    records = {str(r.tif.relative_to(tiny_raw)): r for r in discover(tiny_raw)}
    seen_centred = 0
    for split in _all_splits(tiny_h5).values():
        pos = split.labels == 1
        for src, row, col, image in zip(split.meta["source"][pos], split.meta["row"][pos],
                                        split.meta["col"][pos], split.images[pos],
                                        strict=True):
            mitoses = records[src].mitoses
            offset = np.abs(mitoses - [row, col]).max(axis=1).min()
            assert offset <= cfg.jitter  # every positive holds a mitosis within the jitter
            if offset == 0:
                seen_centred += 1
                # the stored patch is exactly the hematoxylin patch centred on the CSV point
                hema = hematoxylin_channel(read_rgb_tiff(records[src].tif))
                expected = resize_patches(extract_patches(hema, [[row, col]], 100), 28)[0]
                np.testing.assert_array_equal(image[0], expected)
    total_mitoses = sum(len(r.mitoses) for r in records.values())
    assert seen_centred == total_mitoses > 0


def test_negatives_are_tissue_away_from_every_mitosis(tiny_raw, tiny_h5):
    cfg = Tupac16Config()
    records = {str(r.tif.relative_to(tiny_raw)): r for r in discover(tiny_raw)}
    for split in _all_splits(tiny_h5).values():
        neg = split.labels == 0
        assert neg.any()
        for src, row, col in zip(split.meta["source"][neg], split.meta["row"][neg],
                                 split.meta["col"][neg], strict=True):
            mitoses = records[src].mitoses
            if len(mitoses):
                gap = np.abs(mitoses - [row, col]).max(axis=1)
                assert (gap > cfg.patch_size // 2 + cfg.mitosis_radius).all()


def test_split_is_by_case_and_classes_are_balanced(tiny_h5):
    groups = groups_by_split(tiny_h5)
    assert set(groups) == {"train", "val", "test"}
    assert not (groups["train"] & groups["val"] or groups["train"] & groups["test"]
                or groups["val"] & groups["test"])
    labels = np.concatenate([s.labels for s in _all_splits(tiny_h5).values()])
    ratio = (labels == 1).sum() / max(1, (labels == 0).sum())
    assert 0.6 < ratio < 1.6
    info = read_info(tiny_h5)
    assert info.preprocessing["patch_size"] == 100 and info.preprocessing["h_max"] == 0.2
    assert info.class_names == ("non-mitosis", "mitosis")


def test_hematoxylin_channel_is_dark_where_hematoxylin_is_dense():
    synth = render_tupac16_image(np.random.default_rng(7), 256)
    channel = hematoxylin_channel(synth.rgb).astype(float)
    density = synth.hematoxylin
    dense = density > np.quantile(density, 0.95)
    sparse = density < np.quantile(density, 0.5)
    assert channel[dense].mean() < channel[sparse].mean() - 80
    # Beer-Lambert: deconvolution recovers density / ln(1e6) where nothing saturates
    tissue = (density > 0.05) & (density < 1.5)
    recovered = hematoxylin_density(synth.rgb)[tissue]
    assert np.corrcoef(recovered, density[tissue])[0, 1] > 0.98


def test_flattened_layout_gives_the_same_dataset(tiny_raw, tiny_h5, tmp_path):
    flat = tmp_path / "flat"
    for rec in discover(tiny_raw):
        target = flat / rec.case
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(rec.tif, target / rec.tif.name)
        if rec.csv:
            shutil.copy(rec.csv, target / rec.csv.name)
    cfg = Tupac16Config(positives_per_mitosis=4, workers=1, seed=0,
                        fractions={"train": 0.6, "val": 0.2, "test": 0.2})
    out = preprocess_tupac16(flat, tmp_path / "flat.h5", cfg)
    a, b = _all_splits(tiny_h5), _all_splits(out)
    assert a.keys() == b.keys()
    for split in a:
        np.testing.assert_array_equal(a[split].images, b[split].images)
        np.testing.assert_array_equal(a[split].labels, b[split].labels)


@pytest.mark.slow
def test_worker_processes_give_identical_output(tiny_raw, tiny_h5, tmp_path):
    cfg = Tupac16Config(positives_per_mitosis=4, workers=2, seed=0,
                        fractions={"train": 0.6, "val": 0.2, "test": 0.2})
    out = preprocess_tupac16(tiny_raw, tmp_path / "pool.h5", cfg)
    for split, data in _all_splits(out).items():
        np.testing.assert_array_equal(data.images, _all_splits(tiny_h5)[split].images)


def test_user_split_files(tiny_raw, tmp_path):
    (tmp_path / "train.txt").write_text("01\n02\n03\n")
    (tmp_path / "test.txt").write_text("04\n05\n")
    cfg = Tupac16Config(positives_per_mitosis=2, workers=1,
                        split_files={"train": str(tmp_path / "train.txt"),
                                     "test": str(tmp_path / "test.txt")})
    out = preprocess_tupac16(tiny_raw, tmp_path / "user.h5", cfg)
    assert groups_by_split(out) == {"train": {"01", "02", "03"}, "test": {"04", "05"}}
    (tmp_path / "bad.txt").write_text("99\n")
    with pytest.raises(CapsmedError, match="not in the data: 99"):
        preprocess_tupac16(tiny_raw, tmp_path / "bad.h5", Tupac16Config(
            split_files={"train": str(tmp_path / "bad.txt")}, workers=1))
    assert not (tmp_path / "bad.h5").exists()


def test_a_split_without_mitoses_is_warned_about(tiny_raw, tmp_path, caplog):
    raw = tmp_path / "raw"
    shutil.copytree(tiny_raw, raw)
    shutil.rmtree(raw / "mitoses_ground_truth" / "05")
    (tmp_path / "train.txt").write_text("01\n02\n03\n04\n")
    (tmp_path / "test.txt").write_text("05\n")
    cfg = Tupac16Config(positives_per_mitosis=2, workers=1,
                        split_files={"train": str(tmp_path / "train.txt"),
                                     "test": str(tmp_path / "test.txt")})
    with caplog.at_level("WARNING"):
        preprocess_tupac16(raw, tmp_path / "o.h5", cfg)
    assert "split(s) missing a class: test (mitosis)" in caplog.text


def test_config_rejects_jitter_that_could_lose_the_mitosis():
    with pytest.raises(CapsmedError, match="smaller than half the patch"):
        Tupac16Config(patch_size=40, jitter=25)


def _flat_copy(raw, target):
    """``raw`` (official layout) copied to the flattened layout under ``target``."""
    for rec in discover(raw):
        (target / rec.case).mkdir(parents=True, exist_ok=True)
        shutil.copy(rec.tif, target / rec.case / rec.tif.name)
        if rec.csv:
            shutil.copy(rec.csv, target / rec.case / rec.csv.name)
    return target


def test_ground_truth_of_a_case_whose_images_are_missing_is_refused(tiny_raw, tmp_path):
    flat = _flat_copy(tiny_raw, tmp_path / "flat")
    case = next(r.case for r in discover(flat) if len(r.mitoses))
    (flat / "lists").mkdir()  # a CSV that is not ground truth stays allowed there
    (flat / "lists" / "cases.csv").write_text("01\n02\n")
    for tif in (flat / case).glob("*.tif"):
        tif.unlink()  # the case's CSVs stay: its mitoses were silently lost
    with pytest.raises(CapsmedError, match=f"case {case} .*mitoses would be lost"):
        discover(flat)


def test_an_identical_csv_beside_the_image_is_accepted(tiny_raw, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(tiny_raw, raw)
    rec = next(r for r in discover(raw) if len(r.mitoses))
    shutil.copy(rec.csv, rec.tif.with_suffix(".csv"))  # was refused as "no image found"
    again = {(r.case, r.image): r for r in discover(raw)}[(rec.case, rec.image)]
    np.testing.assert_array_equal(again.mitoses, rec.mitoses)


def test_a_mitosis_listed_twice_counts_once_and_is_warned_about(tmp_path, caplog):
    csv = tmp_path / "01.csv"
    csv.write_text("10,20\n30,40\n10,20\n")  # it would get twice its positives
    with caplog.at_level("WARNING"):
        assert read_mitosis_csv(csv).tolist() == [[10, 20], [30, 40]]
    assert "line 3: mitosis at row 10, col 20 is already listed on line 1; counted " \
           "once" in caplog.text
    csv.write_text("10,20\n20,10\n")  # the same numbers in the other order: two mitoses
    assert read_mitosis_csv(csv).tolist() == [[10, 20], [20, 10]]


def test_a_translucent_image_is_refused_and_an_opaque_alpha_dropped(tiny_raw, tmp_path):
    """Predict refuses translucent photographs (the colour under transparency, often
    black, would be scored as tissue): preprocessing refuses them too, naming the file."""
    import tifffile

    raw = tmp_path / "raw"
    shutil.copytree(tiny_raw, raw)
    tif = discover(raw)[0].tif
    rgb = read_rgb_tiff(tif)
    alpha = np.full(rgb.shape[:2], 255, np.uint8)
    tifffile.imwrite(tif, np.dstack([rgb, alpha]), photometric="rgb",
                     extrasamples=["unassalpha"])
    np.testing.assert_array_equal(read_rgb_tiff(tif), rgb)  # opaque: dropped
    alpha[:8] = 0
    tifffile.imwrite(tif, np.dstack([rgb, alpha]), photometric="rgb",
                     extrasamples=["unassalpha"])
    cfg = Tupac16Config(positives_per_mitosis=1, workers=1)
    with pytest.raises(CapsmedError, match=rf"{tif.name}: has transparent pixels, but "
                                           "TUPAC16 images have no alpha"):
        preprocess_tupac16(raw, tmp_path / "out.h5", cfg)
    assert not (tmp_path / "out.h5").exists()
