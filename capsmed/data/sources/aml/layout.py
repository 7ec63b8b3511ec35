"""AML-Cytomorphology_LMU on disk: the classes, where the files are, ``annotations.dat``.

The TCIA release is two downloads: the images, which unpack to
``AML-Cytomorphology/<CLS>/<CLS>_NNNN.tiff``, and ``annotations.dat``. :func:`locate`
finds both in either accepted layout; :func:`gather_records` cross-checks the
annotations against the files. Every failure is one line naming the file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from capsmed.data.files import FolderWalk, check_file, check_name, has_suffix
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)

IMAGE_DIR = "AML-Cytomorphology"
ANNOTATIONS = "annotations.dat"
NOT_REANNOTATED, UNDECIDABLE = "nan", "UNC"
# Paper 001 Table 2 order (label = index); names as in the release's abbreviations.txt.
CLASSES: dict[str, str] = {
    "NGS": "Neutrophil (segmented)", "NGB": "Neutrophil (band)",
    "LYT": "Lymphocyte (typical)", "LYA": "Lymphocyte (atypical)", "MON": "Monocyte",
    "EOS": "Eosinophil", "BAS": "Basophil", "MYO": "Myeloblast", "PMO": "Promyelocyte",
    "PMB": "Promyelocyte (bilobed)", "MYB": "Myelocyte", "MMZ": "Metamyelocyte",
    "MOB": "Monoblast", "EBO": "Erythroblast", "KSC": "Smudge cell",
}
CLASS_NAMES = tuple(CLASSES)
# Images per class in the release (18,365 in all).
RELEASE_COUNTS: dict[str, int] = {
    "NGS": 8484, "NGB": 109, "LYT": 3937, "LYA": 11, "MON": 1789, "EOS": 424, "BAS": 79,
    "MYO": 3268, "PMO": 70, "PMB": 18, "MYB": 42, "MMZ": 15, "MOB": 26, "EBO": 78, "KSC": 15,
}
TIFF_SUFFIXES = (".tif", ".tiff")
# images of another format in a class folder: not read, so refused rather than left out
OTHER_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif")


@dataclass(frozen=True)
class CellRecord:
    """One image: path relative to ``AML-Cytomorphology/``, labels, annotation line."""

    relpath: str
    label: str
    reannotations: tuple[str, str]
    line: int | None  # None: the image is not listed in annotations.dat

    @property
    def image_id(self) -> str:
        return PurePosixPath(self.relpath).stem

    @property
    def agreed(self) -> bool:
        """Every re-annotation given names the original label (none given: kept)."""
        return all(r in (NOT_REANNOTATED, self.label) for r in self.reannotations)


def locate(raw_dir: Path, annotations: Path | None = None) -> tuple[Path, Path]:
    """Find ``(image_root, annotations_file)`` in either accepted layout."""
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise CapsmedError(f"{raw_dir}: no such folder (expected the unpacked "
                           f"AML-Cytomorphology_LMU data)")
    if (raw_dir / IMAGE_DIR).is_dir():
        root, candidates = raw_dir / IMAGE_DIR, [raw_dir / ANNOTATIONS]
    elif any((raw_dir / c).is_dir() for c in CLASS_NAMES):
        root, candidates = raw_dir, [raw_dir.parent / ANNOTATIONS]
    else:
        raise CapsmedError(f"{raw_dir}: no {IMAGE_DIR}/ folder and no class folders "
                           f"({', '.join(sorted(CLASS_NAMES)[:3])}, ...) found")
    candidates.append(root / ANNOTATIONS)
    if annotations is not None:
        if not Path(annotations).is_file():
            raise CapsmedError(f"{annotations}: annotations file not found")
        return root, Path(annotations)
    found = [c for c in candidates if c.is_file()]
    if not found:
        raise CapsmedError(f"{raw_dir}: {ANNOTATIONS} not found (looked for "
                           f"{' and '.join(map(str, candidates))}); download it from the "
                           "TCIA collection page or pass --annotations")
    if len(found) == 2 and found[0].read_bytes() != found[1].read_bytes():
        raise CapsmedError(f"{found[0]}: differs from {found[1]}; pass --annotations to "
                           "choose one")
    return root, found[0]


def _check_label(path: Path, number: int, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise CapsmedError(f"{path}: line {number}: unknown class label {value!r} "
                           f"(known: {', '.join(allowed)})")
    return value


def read_annotations(path: Path) -> list[CellRecord]:
    """Parse ``annotations.dat`` (no header, 4 whitespace-separated fields per line)."""
    try:  # utf-8-sig: a byte-order mark (Windows editors) is not part of the first path
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise CapsmedError(f"{path}: cannot read annotations ({exc})") from exc
    records: dict[str, CellRecord] = {}
    reannotation_values = (*CLASS_NAMES, NOT_REANNOTATED, UNDECIDABLE)
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 4:
            raise CapsmedError(f"{path}: line {number}: expected 4 fields (path, label, "
                               f"re-annotation 1, re-annotation 2), got {len(fields)}")
        rel = PurePosixPath(fields[0].replace("\\", "/"))
        if rel.parts and rel.parts[0] == IMAGE_DIR:  # tolerate a path given from one level up
            rel = PurePosixPath(*rel.parts[1:])
        if rel.is_absolute() or ".." in rel.parts or len(rel.parts) != 2:
            raise CapsmedError(f"{path}: line {number}: expected a path like "
                               f"CLS/CLS_NNNN.tiff, got {fields[0]!r}")
        label = _check_label(path, number, fields[1], CLASS_NAMES)
        if rel.parts[0] != label:
            raise CapsmedError(f"{path}: line {number}: {rel} is in folder {rel.parts[0]} "
                               f"but labelled {label}")
        re1, re2 = (_check_label(path, number, v, reannotation_values) for v in fields[2:])
        key = str(rel)
        if key in records:
            raise CapsmedError(f"{path}: line {number}: {key} is already listed on line "
                               f"{records[key].line}")
        records[key] = CellRecord(key, label, (re1, re2), number)
    if not records:
        raise CapsmedError(f"{path}: no annotations (file is empty)")
    return list(records.values())


def scan_images(root: Path) -> dict[str, list[str]]:
    """``{class: [relative paths]}`` of the TIFFs in each class folder of ``root``
    (extensions in any case; linked folders and files followed, broken links refused)."""
    found: dict[str, list[str]] = {}
    walk = FolderWalk()
    for folder in sorted(root.iterdir()):
        if folder.name.startswith((".", "__")):  # .DS_Store-like and __MACOSX folders
            continue
        check_name(folder)
        if folder.is_symlink() and not folder.exists() and not folder.suffix:
            check_file(folder, "class folder")  # a broken link or a loop: say so
        if not folder.is_dir():
            continue
        others: list[Path] = []
        tiffs = [f"{folder.name}/{p.name}"
                 for p in walk.files(folder, TIFF_SUFFIXES, recursive=False, others=others)]
        if folder.name not in CLASSES:
            if tiffs:
                raise CapsmedError(f"{folder}: folder is not one of the 15 classes "
                                   f"({', '.join(CLASS_NAMES)})")
            continue
        converted = [p for p in others if has_suffix(p, OTHER_IMAGE_SUFFIXES)]
        if converted:
            raise CapsmedError(f"{converted[0]}: not a TIFF; only .tif/.tiff images are "
                               f"read (the release's format), so it would be left out of "
                               f"class {folder.name} (convert it to TIFF or move it away)")
        if not tiffs:
            raise CapsmedError(f"{folder}: class folder holds no .tiff images")
        found[folder.name] = tiffs
    return found


def gather_records(root: Path, annotations: Path) -> tuple[list[CellRecord], list[str]]:
    """Cross-check annotations and files; returns records in class order and unlisted paths.

    Raises:
        CapsmedError: an annotation names a missing file, or a folder is unknown/empty.
    """
    listed = {r.relpath: r for r in read_annotations(annotations)}
    on_disk = scan_images(root)
    for rec in listed.values():
        if not (root / rec.relpath).is_file():
            raise CapsmedError(f"{annotations}: line {rec.line}: names {root / rec.relpath}, "
                               "which does not exist")
    unlisted = [p for paths in on_disk.values() for p in paths if p not in listed]
    read = set(listed) | {p for paths in on_disk.values() for p in paths}
    elsewhere = [rel for p in FolderWalk().files(root, TIFF_SUFFIXES, skip=("__MACOSX",))
                 if (rel := p.relative_to(root).as_posix()) not in read]
    if elsewhere:
        log.warning("%d TIFF(s) under %s are not directly in a class folder (nested "
                    "deeper, or loose) and are not read: %s", len(elsewhere), root,
                    ", ".join(elsewhere[:5]))
    if unlisted:
        # The folder is the original label in the release, so an unlisted image still has
        # a label; it is kept (with no re-annotation), warned about and recorded.
        log.warning("%d image(s) are not listed in %s and are kept with their folder's "
                    "label: %s", len(unlisted), annotations, ", ".join(unlisted[:5]))
    records = list(listed.values()) + [
        CellRecord(p, p.split("/")[0], (NOT_REANNOTATED, NOT_REANNOTATED), None)
        for p in unlisted]
    order = {c: i for i, c in enumerate(CLASS_NAMES)}
    records.sort(key=lambda r: (order[r.label], r.relpath))
    first: dict[str, CellRecord] = {}
    for rec in records:  # the file name is the image's group id: it must be unique
        other = first.setdefault(rec.image_id, rec)
        if other is not rec:
            raise CapsmedError(f"{root / rec.relpath}: has the same name as "
                               f"{root / other.relpath}; the name is each image's id (its "
                               "group), so rename one of them")
    missing = [c for c in CLASS_NAMES if not any(r.label == c for r in records)]
    if missing:
        log.warning("no images of class(es) %s; they stay in class_names with 0 samples",
                    ", ".join(missing))
    return records, unlisted
