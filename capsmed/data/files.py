"""Finding the input files of a source: the rules every reader shares.

A reader that skips a file it should have read writes a dataset that is not what the
user's folder says, with exit code 0: the worst kind of defect. So, everywhere:

* extensions match in any case (``01.TIF``, ``scan.Tiff``);
* symbolically linked folders and files are followed; a link that leads back into its
  own folder is a loop, and a folder or file reached twice (through a link) would be
  read twice: both are errors naming the link;
* two files that differ only in the case of their extension are an error;
* a broken link, or a link loop, where a file should be is an error naming it;
* a file or folder name that is not valid UTF-8 is an error: the dataset file stores
  names as UTF-8 strings, and a name changed on the way in could not be traced back;
* an empty (0-byte) file is an error.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

from capsmed.errors import CapsmedError


def shown(path: Path | str) -> str:
    """``path`` as a printable string: bytes that are not UTF-8 appear as ``\\xe9``."""
    return os.fsencode(str(path)).decode("utf-8", "backslashreplace")


def has_suffix(path: Path | str, suffixes: Iterable[str]) -> bool:
    """Whether the extension of ``path`` is one of ``suffixes`` (``.tif``), in any case."""
    return os.path.splitext(str(path))[1].lower() in {s.lower() for s in suffixes}


def check_name(path: Path) -> None:
    """Refuse a path whose name (or a folder's) is not valid UTF-8."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise CapsmedError(f"{shown(path)}: the name is not valid UTF-8; rename the file or "
                           "folder (names are stored as UTF-8 in the dataset file)") from None


def check_file(path: Path, what: str = "file", allow_empty: bool = False) -> Path:
    """``path`` if it is a readable regular file (links followed), not empty unless
    ``allow_empty``.

    Raises:
        CapsmedError: a broken link, a link loop, not a file, or 0 bytes, naming it.
    """
    path = Path(path)
    check_name(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise CapsmedError(f"{shown(path)}: broken symbolic link (it points to "
                               f"{shown(os.readlink(path))}, which does not exist)") from None
        raise CapsmedError(f"{shown(path)}: no such {what}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link that (eventually) points to itself
            raise CapsmedError(f"{shown(path)}: symbolic link loop (it never reaches a "
                               f"{what})") from None
        raise CapsmedError(f"{shown(path)}: cannot read {what} ({exc.strerror})") from None
    if not os.path.isfile(path):
        raise CapsmedError(f"{shown(path)}: not a regular file (expected a {what})")
    if st.st_size == 0 and not allow_empty:
        raise CapsmedError(f"{shown(path)}: empty {what} (0 bytes)")
    return path


def _once(seen: dict[str, Path], path: Path, real: str, what: str, why: str) -> None:
    """Record ``path`` (whose real path is ``real``) in ``seen``; one reached before,
    through a symbolic link, is an error."""
    if real in seen:
        raise CapsmedError(f"{shown(path)}: the same {what} as {shown(seen[real])} (through "
                           f"a symbolic link); {why}")
    seen[real] = path


class FolderWalk:
    """Walks folders for files with given extensions, following symbolic links.

    One walk may cover several roots (the class folders of a dataset): a real folder or
    file reached a second time, from any root, is an error, because its files would be
    read twice (twice the samples, or one image in two classes).
    """

    def __init__(self) -> None:
        self._seen: dict[str, Path] = {}
        self._seen_files: dict[str, Path] = {}

    def _file(self, path: Path) -> Path:
        """``path``, checked; a real file reached a second time (a linked file) is an
        error, as a folder reached twice is."""
        check_file(path, allow_empty=True)
        _once(self._seen_files, path, os.path.realpath(path), "file", "it would be read twice")
        return path

    def _enter(self, folder: Path, ancestors: tuple[str, ...]) -> str:
        real = os.path.realpath(folder)
        if real in ancestors:
            raise CapsmedError(f"{shown(folder)}: symbolic link loop (it leads back to "
                               f"{shown(real)}, a folder that contains it)")
        _once(self._seen, folder, real, "folder", "its files would be read twice")
        return real

    def files(self, root: Path, suffixes: Iterable[str], *, recursive: bool = True,
              skip: Iterable[str] = (), others: list[Path] | None = None) -> list[Path]:
        """Sorted files under ``root`` whose extension is one of ``suffixes`` (any case).

        Names starting with ``.`` and folders named in ``skip`` are left out. Every file
        found is checked with :func:`check_file` (an empty file is the reader's call),
        and so is a broken link with no extension: it may be a lost folder. The files
        passed over for their extension are appended to ``others`` when it is given.
        """
        suffixes, skip = tuple(suffixes), set(skip)
        found: list[Path] = []

        def visit(folder: Path, ancestors: tuple[str, ...]) -> None:
            real = self._enter(folder, ancestors)
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError as exc:
                raise CapsmedError(f"{shown(folder)}: cannot list folder "
                                   f"({exc.strerror})") from None
            for entry in entries:
                if entry.name.startswith(".") or entry.name in skip:
                    continue
                path = Path(folder, entry.name)
                try:
                    is_dir = entry.is_dir()  # follows links
                except OSError:  # a link loop
                    check_file(path)
                if is_dir:
                    if recursive:
                        visit(path, (*ancestors, real))
                elif has_suffix(entry.name, suffixes):
                    found.append(self._file(path))
                elif others is not None and os.path.splitext(entry.name)[1]:
                    others.append(path)
                elif entry.is_symlink() and not os.path.splitext(entry.name)[1] \
                        and not os.path.exists(path):
                    check_file(path, "folder")

        visit(Path(root), ())
        return found


def refuse_same_stem(files: list[Path]) -> list[Path]:
    """``files``, refused where two in one folder differ only in the case of their
    extension (``image001.png`` and ``image001.PNG``): one image would count twice.

    Raises:
        CapsmedError: naming both files.
    """
    seen: dict[tuple[str, str, str], Path] = {}
    for path in files:
        stem, ext = os.path.splitext(path.name)
        key = (str(path.parent), stem, ext.lower())
        if key in seen:
            raise CapsmedError(f"{shown(seen[key])}: also present as {shown(path.name)}; "
                               "keep one")
        seen[key] = path
    return files


def find_in_folder(folder: Path, stem: str, suffix: str) -> Path | None:
    """The file ``<stem><suffix>`` in ``folder``, its extension in any case (``01.CSV``).

    Raises:
        CapsmedError: two files differ only in the case of their extension.
    """
    exact = folder / f"{stem}{suffix}"
    if exact.is_file():
        return exact
    try:
        names = [n for n in os.listdir(folder)
                 if os.path.splitext(n)[0] == stem and has_suffix(n, (suffix,))]
    except OSError:
        return None
    if len(names) > 1:
        raise CapsmedError(f"{shown(folder / names[0])}: also present as "
                           f"{', '.join(sorted(names[1:]))}; keep one")
    return folder / names[0] if names else None
