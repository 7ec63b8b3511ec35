"""Tests for the synthetic TUPAC16 generator (capsmed.data.sources.tupac16.synth)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import tifffile
from skimage.color import rgb2hed

from capsmed.data.sources.tupac16 import synth
from capsmed.data.sources.tupac16.synth import (
    E_STAIN,
    H_STAIN,
    SynthImage,
    case_part,
    render_tupac16_image,
    write_tupac16,
)
from capsmed.data.synth.histology import BORDER
from capsmed.errors import CapsmedError

LN_1E6 = -math.log(1e-6)  # rgb2hed divides optical density by this


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _leftovers(parent: Path) -> list[str]:
    """Temporary folders atomic_dir would leave behind if it failed to clean up."""
    return [p.name for p in parent.iterdir() if p.name.endswith(".partial")]


def _near_max(values: np.ndarray, points: np.ndarray, radius: int, q: float = 90) -> np.ndarray:
    """``q``-th percentile of ``values`` within ``radius`` px of each point."""
    yy, xx = np.mgrid[-radius:radius + 1, -radius:radius + 1]
    disk = yy**2 + xx**2 <= radius**2
    padded = np.pad(values, radius)
    return np.array([np.percentile(padded[y:y + 2 * radius + 1, x:x + 2 * radius + 1][disk], q)
                     for y, x in points])


def test_stain_vectors_are_the_ones_rgb2hed_inverts():
    from skimage.color import rgb_from_hed

    np.testing.assert_allclose(rgb_from_hed[0], H_STAIN)
    np.testing.assert_allclose(rgb_from_hed[1], E_STAIN)


def test_render_types_and_shapes():
    img = render_tupac16_image(np.random.default_rng(3), 200, mitoses_per_megapixel=100)
    assert isinstance(img, SynthImage)
    assert img.rgb.shape == (200, 200, 3) and img.rgb.dtype == np.uint8
    assert img.hematoxylin.shape == (200, 200) and img.hematoxylin.dtype == np.float32
    assert img.mitoses.dtype == np.int64 and img.mitoses.shape[1] == 2 and len(img.mitoses) > 0
    assert img.lookalikes.dtype == np.int64 and img.lookalikes.shape[1] == 2
    assert img.hematoxylin.min() >= 0.0 and img.hematoxylin.max() <= synth.H_CLIP + 1e-6
    # mostly tissue, but with some white background for a tissue detector to find
    white = (img.rgb.astype(int).mean(axis=-1) > 235).mean()
    assert 0.03 < white < 0.45


def test_render_is_deterministic_for_a_generator_state():
    a = render_tupac16_image(np.random.default_rng([1, 2, 3]), 160)
    b = render_tupac16_image(np.random.default_rng([1, 2, 3]), 160)
    c = render_tupac16_image(np.random.default_rng([1, 2, 4]), 160)
    assert np.array_equal(a.rgb, b.rgb) and np.array_equal(a.mitoses, b.mitoses)
    assert not np.array_equal(a.rgb, c.rgb)


def test_mitoses_are_spaced_and_inside_the_image():
    size = 384
    img = render_tupac16_image(np.random.default_rng(11), size, mitoses_per_megapixel=150)
    m = img.mitoses
    assert len(m) >= 8
    assert (m >= BORDER).all() and (m < size - BORDER).all()
    d = np.hypot(*(m[:, None, :] - m[None, :, :]).transpose(2, 0, 1))
    d[np.diag_indices(len(m))] = np.inf
    assert d.min() >= synth.MIN_MITOSIS_SPACING
    assert ((img.lookalikes >= 0) & (img.lookalikes < size)).all()


def test_zero_rate_gives_no_mitoses():
    img = render_tupac16_image(np.random.default_rng(0), 160, mitoses_per_megapixel=0)
    assert img.mitoses.shape == (0, 2) and img.mitoses.dtype == np.int64


def test_rgb2hed_recovers_hematoxylin_and_mitoses_are_dark():
    mit_h, la_h = [], []
    for seed in range(6):
        img = render_tupac16_image(np.random.default_rng(seed), 256, mitoses_per_megapixel=60)
        h = rgb2hed(img.rgb)[..., 0]
        tissue = img.hematoxylin > 0.03
        assert np.corrcoef(h[tissue], img.hematoxylin[tissue])[0, 1] > 0.98
        # Beer-Lambert with skimage's vectors: rgb2hed gives cH / ln(1e6) where nothing clips
        assert np.median(np.abs(h[tissue] * LN_1E6 - img.hematoxylin[tissue])) < 0.05
        if len(img.mitoses):
            # the densest chromatin near every mitosis is darker than 95% of the tissue
            near = _near_max(h, img.mitoses, radius=12, q=100)
            assert (near > np.percentile(h[tissue], 95)).all()
            assert near.min() > 0.07  # cH > ~1 (paler than that is ordinary nuclei)
        mit_h.append(_near_max(img.hematoxylin, img.mitoses, radius=8))
        la_h.append(_near_max(img.hematoxylin, img.lookalikes, radius=8))
    # Anaphase centres fall in the gap between chromatid sets, so compare the dense chromatin
    # within 8 px of each centre rather than the single centre pixel.
    assert np.concatenate(mit_h).mean() > np.concatenate(la_h).mean() + 0.1


def test_case_part_follows_the_official_ranges():
    assert [case_part(c) for c in (1, 14, 15, 33, 34, 73)] == [1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError):
        case_part(74)


def test_official_layout(tmp_path):
    out = tmp_path / "raw"
    summary = write_tupac16(out, cases=15, images_per_case=1, size=128, seed=2,
                            disable_progress=True)
    assert summary.root == out and summary.images == 15 and summary.cases == 15
    tifs = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.tif"))
    assert tifs == [f"mitoses_image_data_part_{1 if c <= 14 else 2}/{c:02d}/01.tif"
                    for c in range(1, 16)]
    csvs = list(out.rglob("*.csv"))
    assert all(p.parent.parent.name == "mitoses_ground_truth" for p in csvs)
    assert sum(len(p.read_text().splitlines()) for p in csvs) == summary.mitoses
    assert _leftovers(tmp_path) == []


def test_flat_layout(tmp_path):
    out = tmp_path / "flat"
    summary = write_tupac16(out, cases=2, images_per_case=2, size=256, seed=1, layout="flat",
                            disable_progress=True)
    tifs = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.tif"))
    assert tifs == ["01/01.tif", "01/02.tif", "02/01.tif", "02/02.tif"]
    csvs = sorted(out.rglob("*.csv"))
    assert csvs and all(p.with_suffix(".tif").is_file() for p in csvs)
    assert not (out / "mitoses_ground_truth").exists()
    assert sum(len(p.read_text().splitlines()) for p in csvs) == summary.mitoses


def test_written_files_match_the_renderer(tmp_path):
    """TIFF pixels and CSV rows equal a fresh render with default_rng([seed, case, image])."""
    out, seed, size = tmp_path / "raw", 3, 256
    write_tupac16(out, cases=2, images_per_case=2, size=size, seed=seed, disable_progress=True)
    with_csv = without_csv = 0
    for case in (1, 2):
        for image in (1, 2):
            expected = render_tupac16_image(np.random.default_rng([seed, case, image]), size)
            tif = out / "mitoses_image_data_part_1" / f"{case:02d}" / f"{image:02d}.tif"
            with tifffile.TiffFile(tif) as f:
                assert f.pages[0].photometric == tifffile.PHOTOMETRIC.RGB
                assert np.array_equal(f.asarray(), expected.rgb)
            csv = out / "mitoses_ground_truth" / f"{case:02d}" / f"{image:02d}.csv"
            if len(expected.mitoses) == 0:
                assert not csv.exists()  # the real data has no CSV for mitosis-free images
                without_csv += 1
                continue
            with_csv += 1
            text = csv.read_text()
            assert text.endswith("\n")
            rows = [tuple(int(v) for v in line.split(",")) for line in text.splitlines()]
            assert all(len(r) == 2 for r in rows)  # no header, exactly row,col
            got = np.array(rows, dtype=np.int64)
            assert ((got >= 0) & (got < size)).all()
            assert np.array_equal(got, expected.mitoses)
    # this seed/size must exercise both cases, or the test proves less than it claims
    assert with_csv and without_csv


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    kw = dict(cases=2, images_per_case=2, size=160, disable_progress=True)
    a = _files(write_tupac16(tmp_path / "a", seed=5, **kw).root)
    b = _files(write_tupac16(tmp_path / "b", seed=5, **kw).root)
    c = _files(write_tupac16(tmp_path / "c", seed=6, **kw).root)
    assert a == b
    tifs = [k for k in a if k.endswith(".tif")]
    assert len(tifs) == 4 and all(a[k] != c.get(k) for k in tifs)


@pytest.mark.parametrize("kwargs", [dict(cases=0), dict(cases=74), dict(images_per_case=0),
                                    dict(size=127), dict(layout="nested"), dict(seed=-1)])
def test_bad_arguments_are_refused_and_leave_nothing(tmp_path, kwargs):
    out = tmp_path / "raw"
    with pytest.raises(CapsmedError, match=f"^{re.escape(str(out))}: "):
        write_tupac16(out, **{"size": 128, **kwargs}, disable_progress=True)
    assert not out.exists() and _leftovers(tmp_path) == []


def test_non_empty_output_folder_is_refused(tmp_path):
    out = tmp_path / "raw"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(CapsmedError, match=f"^{re.escape(str(out))}: "):
        write_tupac16(out, cases=1, images_per_case=1, size=128, disable_progress=True)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert _leftovers(tmp_path) == []


def test_failure_mid_write_leaves_no_partial_folder(tmp_path, monkeypatch):
    out = tmp_path / "raw"
    calls = []
    real_imwrite = tifffile.imwrite

    def failing_imwrite(path, data, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        real_imwrite(path, data, **kwargs)

    monkeypatch.setattr(synth.tifffile, "imwrite", failing_imwrite)
    with pytest.raises(OSError, match="disk full"):
        write_tupac16(out, cases=1, images_per_case=3, size=128, disable_progress=True)
    assert len(calls) == 2
    assert not out.exists() and _leftovers(tmp_path) == []
