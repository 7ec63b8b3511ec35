"""The preprocessing fault sweep (issue 12), table-driven, through the real CLI.

Each case breaks a fresh copy of a source's synthetic raw data in one way. A refused
case must exit 1 with exactly one ``error:`` line naming the file, no traceback, no
output file and no temporary beside it, and no worker process left. An accepted case
(upper-case extensions, a linked folder, a byte-order mark) must write exactly the
samples the pristine layout gives: skipping those files silently was the defect.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from capsmed.data.contract import load_split, read_info
from capsmed.data.files import shown
from tests.faults.common import assert_refused, invoke

SOURCES = ("tupac16", "folder", "aml", "diaretdb1")
FAST = {"tupac16": ["--positives-per-mitosis", "2", "--workers", "1"],
        "folder": ["--workers", "1", "--group-pattern", r"^(P\d+)_"],
        "aml": ["--folds", "2", "--workers", "1"],
        "diaretdb1": ["--workers", "1", "--patch-size", "64", "--stride", "64"]}


@pytest.fixture(scope="session")
def synth_raw(tmp_path_factory) -> dict[str, Path]:
    """Small synthetic raw data of each source, written once per session."""
    from capsmed.data.sources.aml.synth import write_aml
    from capsmed.data.sources.diaretdb1.synth import write_diaretdb1
    from capsmed.data.sources.folder.synth import write_class_folders
    from capsmed.data.sources.tupac16.synth import write_tupac16

    root = tmp_path_factory.mktemp("synth")
    write_tupac16(root / "tupac16", cases=4, images_per_case=2, size=256, seed=3)
    write_class_folders(root / "folder", classes=2, images_per_class=6, patients=3, size=32)
    write_aml(root / "aml", per_class_scale=0.0005, size=48, min_per_class=2)
    write_diaretdb1(root / "diaretdb1", images=6, size=(320, 256))
    return {name: root / name for name in SOURCES}


@pytest.fixture(scope="session")
def pristine(synth_raw, tmp_path_factory) -> dict[str, Path]:
    """Each source's dataset from the untouched synthetic data."""
    out = tmp_path_factory.mktemp("pristine")
    made = {}
    for source in SOURCES:
        made[source] = out / f"{source}.h5"
        result = invoke(["preprocess", source, synth_raw[source], "-o", made[source],
                         *FAST[source]])
        assert result.exit_code == 0, result.output
    return made


@pytest.fixture
def raw_copy(synth_raw, tmp_path):
    """A fresh copy of one source's synthetic raw data, in this test's folder."""

    def copy(source: str) -> Path:
        target = tmp_path / "raw" / source
        shutil.copytree(synth_raw[source], target, symlinks=True)
        return target

    return copy


def _samples(path: Path) -> dict[str, list[tuple]]:
    """What must not change, in any order: each sample's group, label and pixels."""
    out = {}
    for split in read_info(path).split_sizes:
        data = load_split(path, split)
        out[split] = sorted((str(g), int(y), x.tobytes())
                            for g, y, x in zip(data.groups, data.labels, data.images,
                                               strict=True))
    return out


def _png_header(path: Path, width: int, height: int) -> None:
    """A PNG whose header claims width x height (its pixel data is a few bytes)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data))
    path.write_bytes(b"\x89PNG\r\n\x1a\n"
                     + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


def _first(raw: Path, pattern: str) -> Path:
    return sorted(raw.rglob(pattern))[0]


def _csv_with_mitoses(raw: Path) -> Path:
    return next(p for p in sorted(raw.rglob("*.csv")) if p.read_text().strip())


def _image_of(raw: Path, csv: Path) -> Path:
    """The TUPAC16 image a ground-truth CSV annotates (case folder / image number)."""
    return next(p for p in sorted(raw.rglob(f"{csv.stem}.tif"))
                if p.parent.name == csv.parent.name)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _symlink(path: Path, target: str) -> Path:
    path.unlink()
    os.symlink(target, path)
    return path


def _rename_bytes(path: Path, name: bytes) -> Path:
    """Rename ``path`` to a name that is not valid UTF-8."""
    target = os.fsencode(path.parent) + b"/" + name
    os.rename(os.fsencode(path), target)
    return Path(os.fsdecode(target))


def _greyscale(path: Path) -> Path:
    """Save ``path`` again as an 8-bit greyscale image in its own format."""
    import cv2
    import tifffile

    if path.suffix.lower() in (".tif", ".tiff"):
        tifffile.imwrite(path, tifffile.imread(path)[..., 1])
    else:
        cv2.imwrite(str(path), cv2.imread(str(path), cv2.IMREAD_GRAYSCALE))
    return path


# (id, source, break it -> (the path the error names, text in the error), extra args)
Breaker = Callable[[Path], tuple[object, str]]
REFUSED: list[tuple[str, str, Breaker, list[str]]] = [
    # item 4: labels all absent
    ("tupac16-no-ground-truth-folder", "tupac16", lambda raw: (
        shutil.rmtree(raw / "mitoses_ground_truth"),
        (raw / "mitoses_ground_truth", "no ground-truth CSV found (no such folder)"))[1], []),
    # item 8: coordinates that overflow
    ("tupac16-csv-1e400", "tupac16", lambda raw: (
        _write(_first(raw, "*.csv"), "1e400,5\n"), "line 1: expected 'row,col'"), []),
    ("tupac16-csv-20-digits", "tupac16", lambda raw: (
        _write(_first(raw, "*.csv"), "10,10\n12345678901234567890,5\n"), "line 2"), []),
    # item 10: empty and absurdly large images, checked before decoding
    ("tupac16-zero-byte-tif", "tupac16", lambda raw: (
        _write(_first(raw, "*.tif"), ""), "empty image (0 bytes)"), []),
    ("folder-zero-byte-png", "folder", lambda raw: (
        _write(_first(raw, "*.png"), ""), "empty image (0 bytes)"), []),
    ("folder-png-claims-200000x200000", "folder", lambda raw: (
        _png_header(p := _first(raw, "*.png"), 200_000, 200_000) or p,
        "claims 200000x200000 pixels"), []),
    ("aml-zero-byte-tiff", "aml", lambda raw: (
        _write(_first(raw, "*.tiff"), ""), "empty image (0 bytes)"), []),
    ("diaretdb1-zero-byte-fundus-image", "diaretdb1", lambda raw: (
        _write(_first(raw, "ddb1_fundusimages/*.png"), ""), "empty fundus image (0 bytes)"),
     []),
    ("diaretdb1-map-claims-200000x200000", "diaretdb1", lambda raw: (
        _png_header(p := _first(raw, "hemorrhages/*.png"), 200_000, 200_000) or p,
        "claims 200000x200000 pixels"), []),
    # issue 23 item 3: a colour source refuses a greyscale image in every format
    ("tupac16-greyscale-tif", "tupac16", lambda raw: (
        _greyscale(_first(raw, "*.tif")), "expected an RGB image"), []),
    ("aml-greyscale-tiff", "aml", lambda raw: (
        _greyscale(_first(raw, "*.tiff")), "expected an RGB(A) image"), []),
    ("diaretdb1-greyscale-png", "diaretdb1", lambda raw: (
        _greyscale(_first(raw, "ddb1_fundusimages/*.png")), "expected an 8-bit RGB image"),
     []),
    # item 11: image symlink loops and broken links
    ("tupac16-broken-link-tif", "tupac16", lambda raw: (
        _symlink(_first(raw, "*.tif"), "nowhere.tif"), "broken symbolic link"), []),
    ("tupac16-link-loop-tif", "tupac16", lambda raw: (
        _symlink(_first(raw, "*.tif"), _first(raw, "*.tif").name), "symbolic link loop"), []),
    ("folder-broken-link-png", "folder", lambda raw: (
        _symlink(_first(raw, "*.png"), "gone.png"), "broken symbolic link"), []),
    ("aml-broken-link-tiff", "aml", lambda raw: (
        _symlink(sorted((raw / "AML-Cytomorphology" / "NGS").iterdir())[-1], "gone.tiff"),
        "broken symbolic link"), []),
    # item 2: linked folders are followed, but a loop or a folder read twice is refused
    ("tupac16-folder-link-loop", "tupac16", lambda raw: (
        os.symlink("..", p := _first(raw, "*.tif").parent / "back") or p,
        "symbolic link loop"), []),
    ("folder-class-linked-twice", "folder", lambda raw: (
        os.symlink(sorted(raw.iterdir())[0].name, raw / "zz_copy")
        or raw / "zz_copy", "the same folder as"), []),
    # item 9: names that are not UTF-8
    ("tupac16-case-name-not-utf8", "tupac16", lambda raw: (
        shown(_rename_bytes(_first(raw, "*.tif").parent, b"0\xe9")), "not valid UTF-8"), []),
    ("folder-class-name-not-utf8", "folder", lambda raw: (
        shown(_rename_bytes(sorted(raw.iterdir())[0], b"caf\xe9")), "not valid UTF-8"), []),
    ("folder-file-name-not-utf8", "folder", lambda raw: (
        shown(_rename_bytes(_first(raw, "*.png"), b"P01_\xff.png")), "not valid UTF-8"), []),
    # item 24: say why, name the right files
    ("tupac16-1x1-image", "tupac16", lambda raw: (
        __import__("tifffile").imwrite(p := _first(raw, "*.tif"),
                                       np.zeros((1, 1, 3), np.uint8)) or p,
        "image is 1x1 px, too small for one 100x100 patch"), []),
    ("aml-same-name-in-two-classes", "aml", lambda raw: (
        os.rename(raw / "AML-Cytomorphology/BAS/BAS_0001.tiff",
                  raw / "AML-Cytomorphology/BAS/EOS_0001.tiff"),
        _write(raw / "annotations.dat", (raw / "annotations.dat").read_text().replace(
            "BAS/BAS_0001.tiff", "BAS/EOS_0001.tiff")),
        (raw / "AML-Cytomorphology/BAS/EOS_0001.tiff",
         f"has the same name as {raw}/AML-Cytomorphology/EOS/EOS_0001.tiff"))[2], []),
    # audit: files read twice, or annotations dropped, without a word
    ("folder-file-linked-into-another-class", "folder", lambda raw: (
        os.symlink(f"../{(a := sorted(raw.iterdir()))[0].name}/{_first(a[0], '*.png').name}",
                   p := a[-1] / _first(a[0], "*.png").name) or p, "the same file as"), []),
    ("diaretdb1-image-twice-by-extension-case", "diaretdb1", lambda raw: (
        shutil.copy(p := _first(raw, "ddb1_fundusimages/*.png"), p.with_suffix(".PNG")),
        (p.with_suffix(".PNG"), f"also present as {p.name}"))[1], []),
    ("tupac16-csv-whose-image-is-missing", "tupac16", lambda raw: (
        (csv := _csv_with_mitoses(raw)),
        _image_of(raw, csv).rename(_image_of(raw, csv).with_suffix(".tif.part")),
        (csv, f"no image {csv.parent.name}/{csv.stem}.tif was found"))[2], []),
    ("tupac16-csv-non-integer-coordinate", "tupac16", lambda raw: (
        _write(_csv_with_mitoses(raw), "60.9,180.9\n"), "line 1: expected 'row,col' integers"),
     []),
    ("tupac16-two-csvs-that-disagree", "tupac16", lambda raw: (
        (csv := _csv_with_mitoses(raw)),
        (beside := _image_of(raw, csv).with_suffix(".csv")).write_text("10,10\n"),
        (beside, f"differs from {csv}"))[2], []),
    # item 6: split fractions must sum to 1, for every source that has them
    ("tupac16-fractions-sum-1.9", "tupac16", lambda raw: ("split fractions", "must sum to 1"),
     ["--train", "0.9", "--val", "0.9", "--test", "0.1"]),
    ("folder-fractions-sum-0.95", "folder", lambda raw: ("split fractions", "must sum to 1"),
     ["--train", "0.8"]),
]


@pytest.mark.parametrize("source, break_it, extra",
                         [pytest.param(s, b, e, id=i) for i, s, b, e in REFUSED])
def test_bad_raw_data_is_refused_cleanly(raw_copy, tmp_path, source, break_it, extra):
    raw = raw_copy(source)
    named, text = break_it(raw)
    out = tmp_path / "out" / "data.h5"
    result = invoke(["preprocess", source, raw, "-o", out, *FAST[source], *extra])
    assert_refused(result, named, text=text, absent=[out])
    assert not multiprocessing.active_children()


def _upper_case_extensions(raw: Path) -> None:
    for path in sorted(raw.rglob("*.*")):
        if path.suffix in (".tif", ".csv", ".png"):
            path.rename(path.with_suffix(path.suffix.upper()))


def _linked_folder(raw: Path, folder: Path) -> None:
    """Move ``folder`` out of ``raw`` and link it back under its own name."""
    outside = raw.parent / f"elsewhere-{folder.name}"
    shutil.move(folder, outside)
    os.symlink(outside, folder)


ACCEPTED: list[tuple[str, str, Callable[[Path], object]]] = [
    # item 3: extensions in any case, and their CSVs with them
    ("tupac16-upper-case-extensions", "tupac16", _upper_case_extensions),
    ("folder-upper-case-extensions", "folder", _upper_case_extensions),
    ("diaretdb1-upper-case-extensions", "diaretdb1", _upper_case_extensions),
    ("aml-upper-case-folder-scan", "aml", lambda raw: [
        p.rename(p.with_suffix(".TIFF")) for p in raw.rglob("NGS_0001.tiff")] and
        _write(raw / "annotations.dat", (raw / "annotations.dat").read_text().replace(
            "NGS/NGS_0001.tiff", "NGS/NGS_0001.TIFF"))),
    # item 2: a linked case folder / class folder / nested folder is read, not dropped
    ("tupac16-linked-case-folder", "tupac16",
     lambda raw: _linked_folder(raw, _first(raw, "*.tif").parent)),
    ("tupac16-linked-ground-truth-case", "tupac16",
     lambda raw: _linked_folder(raw, _first(raw, "*.csv").parent)),
    ("folder-linked-class-folder", "folder",
     lambda raw: _linked_folder(raw, sorted(raw.iterdir())[0])),
    ("folder-linked-nested-folder", "folder", lambda raw: (
        (nested := sorted(raw.iterdir())[0] / "scanner2").mkdir(),
        [shutil.move(p, nested / p.name) for p in sorted(nested.parent.glob("*.png"))[:3]],
        _linked_folder(raw, nested))),
    # item 24: a byte-order mark before the first path of annotations.dat
    ("aml-annotations-with-bom", "aml", lambda raw: (raw / "annotations.dat").write_bytes(
        b"\xef\xbb\xbf" + (raw / "annotations.dat").read_bytes())),
]


@pytest.mark.parametrize("source, change",
                         [pytest.param(s, c, id=i) for i, s, c in ACCEPTED])
def test_unusual_but_valid_layouts_give_the_same_samples(raw_copy, tmp_path, pristine,
                                                         source, change):
    raw = raw_copy(source)
    change(raw)
    out = tmp_path / "data.h5"
    result = invoke(["preprocess", source, raw, "-o", out, *FAST[source]])
    assert result.exit_code == 0, result.output
    got, want = _samples(out), _samples(pristine[source])
    assert {s: len(v) for s, v in got.items()} == {s: len(v) for s, v in want.items()}
    assert got == want


def test_no_annotations_can_be_allowed_explicitly(raw_copy, tmp_path):
    raw = raw_copy("tupac16")
    shutil.rmtree(raw / "mitoses_ground_truth")
    out = tmp_path / "data.h5"
    result = invoke(["preprocess", "tupac16", raw, "-o", out, *FAST["tupac16"],
                     "--allow-no-annotations"])
    assert result.exit_code == 0, result.output
    assert read_info(out).preprocessing["allow_no_annotations"] is True
