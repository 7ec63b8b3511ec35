"""Compressed TIFFs read everywhere: LZW (OpenCV's default, e.g. a re-saved fmask.tif),
Deflate and JPEG give the same samples as uncompressed files, through every reader
that opens TIFFs (TUPAC16, AML, DIARETDB1's mask, class folders, predict). Without
imagecodecs, tifffile refuses them ("requires the 'imagecodecs' package")."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tifffile

from capsmed.data.contract import load_split, read_info
from capsmed.data.images import read_tiff
from capsmed.data.replay.images import read_rgb
from capsmed.data.sources.aml.config import AmlConfig
from capsmed.data.sources.aml.reader import preprocess_aml
from capsmed.data.sources.aml.synth import write_aml
from capsmed.data.sources.diaretdb1.layout import read_fundus_mask
from capsmed.data.sources.diaretdb1.synth import write_diaretdb1
from capsmed.data.sources.folder.config import FolderConfig
from capsmed.data.sources.folder.reader import load_image
from capsmed.data.sources.tupac16.config import Tupac16Config
from capsmed.data.sources.tupac16.reader import preprocess_tupac16

LOSSLESS = ("lzw", "zlib")


def recompress(path: Path, compression: str) -> None:
    """Rewrite a TIFF in place with ``compression``, keeping its colours and alpha."""
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        data, photometric = page.asarray(), page.photometric
        extras = tuple(int(e) for e in page.extrasamples) or None
    tifffile.imwrite(path, data, photometric=photometric, extrasamples=extras,
                     compression=compression)
    with tifffile.TiffFile(path) as tif:
        assert tif.pages[0].compression != tifffile.COMPRESSION.NONE


def _same_dataset(a: Path, b: Path) -> None:
    for split in read_info(a).split_sizes:
        x, y = load_split(a, split), load_split(b, split)
        assert np.array_equal(x.images, y.images) and np.array_equal(x.labels, y.labels)


@pytest.mark.parametrize("compression", [*LOSSLESS, "jpeg"])
def test_read_tiff_decodes_every_compression(tmp_path, compression):
    rgb = np.random.default_rng(0).integers(0, 256, (64, 48, 3), dtype=np.uint8)
    rgb[:, :24] = 90  # a smooth half for JPEG
    plain, packed = tmp_path / "plain.tif", tmp_path / f"{compression}.tif"
    tifffile.imwrite(plain, rgb)
    shutil.copy(plain, packed)
    recompress(packed, compression)
    image, _ = read_tiff(packed)
    if compression in LOSSLESS:
        assert np.array_equal(image, rgb) and np.array_equal(read_rgb(packed), rgb)
    else:
        assert image.shape == rgb.shape and np.abs(image[:, :16].astype(int) - 90).max() < 8
    grey = load_image(packed, None, FolderConfig())[0]  # a class folder's reader
    assert grey.shape == (3, 64, 48)


def test_tupac16_images_saved_with_lzw_give_the_same_dataset(tiny_raw, tiny_h5, tmp_path):
    copy = tmp_path / "tupac16"
    shutil.copytree(tiny_raw, copy)
    for tif in copy.rglob("*.tif"):
        recompress(tif, "lzw")
    cfg = Tupac16Config(positives_per_mitosis=4, workers=1, seed=0,
                        fractions={"train": 0.6, "val": 0.2, "test": 0.2})
    _same_dataset(tiny_h5, preprocess_tupac16(copy, tmp_path / "lzw.h5", cfg))


def test_aml_tiffs_saved_with_deflate_give_the_same_dataset(tmp_path):
    raw = tmp_path / "aml"
    write_aml(raw, per_class_scale=0.002, size=48, seed=2)
    cfg = AmlConfig(workers=1, size=16)
    plain = preprocess_aml(raw, tmp_path / "plain.h5", cfg, disable_progress=True)
    for tif in raw.rglob("*.tiff"):
        recompress(tif, "zlib")
    _same_dataset(plain, preprocess_aml(raw, tmp_path / "zlib.h5", cfg,
                                        disable_progress=True))


def test_a_fundus_mask_saved_with_lzw_reads_the_same(tmp_path):
    raw = tmp_path / "ddb1"
    write_diaretdb1(raw, images=3, size=(160, 123), seed=1)
    mask = next(raw.rglob("fmask.tif"))
    before = read_fundus_mask(mask)
    recompress(mask, "lzw")
    assert np.array_equal(read_fundus_mask(mask), before) and before.any()
