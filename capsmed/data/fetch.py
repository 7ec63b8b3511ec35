"""Download raw dataset files with checksum verification (``capsmed fetch``).

Each file is downloaded to ``<name>.part`` beside its final name. An interrupted
download resumes from the bytes already there (an HTTP ``Range`` request; a server
that ignores it sends the whole file and the part is restarted). The file is renamed
into place only after its MD5 matches the published checksum, so a final name always
holds a verified file. Files already present with a good checksum are skipped. Mirrors
are tried in order; if all fail, the error says how to place the files by hand.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import math
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.progress import DownloadColumn, Progress, TaskID, TransferSpeedColumn

from capsmed import __version__
from capsmed.errors import CapsmedError
from capsmed.io import ensure_writable_dir
from capsmed.progress import make_progress

log = logging.getLogger(__name__)

BLOCK = 1 << 16
DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True)
class RemoteDataset:
    """Where a dataset's raw files live and what they must hash to.

    Attributes:
        name: Dataset name as the CLI spells it.
        mirrors: Base URLs tried in order (each ends with ``/``).
        md5: ``{file name: published MD5}``.
        homepage: Where the dataset is described (for the by-hand instructions).
    """

    name: str
    mirrors: tuple[str, ...]
    md5: Mapping[str, str]
    homepage: str = ""


class _DownloadFailed(Exception):
    """One mirror could not deliver one file (the reason is the message)."""


def file_md5(path: Path) -> str:
    """MD5 hex digest of a file, read in blocks."""
    digest = hashlib.md5(usedforsecurity=False)
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def _join(base: str, name: str) -> str:
    return base if base.endswith(name) else base.rstrip("/") + "/" + name


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        text = getattr(reason, "strerror", None) or str(reason)
        return text.lower() if isinstance(reason, OSError) else str(text)
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"


def _download(url: str, part: Path, *, timeout: float, progress: Progress,
              task: TaskID) -> None:
    """Fetch ``url`` into ``part``, resuming from its current length when possible."""
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": f"capsmed/{__version__}"}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the part already holds the whole file
            return
        raise _DownloadFailed(_reason(exc)) from exc
    except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
        raise _DownloadFailed(_reason(exc)) from exc
    with response:
        resumed = response.status == 206
        if have and not resumed:
            log.info("%s: server ignored the range request; restarting", url)
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        progress.update(task, total=total, completed=have)
        try:
            with part.open("ab" if resumed else "wb") as out:
                for block in iter(lambda: response.read(BLOCK), b""):
                    out.write(block)
                    progress.advance(task, len(block))
        except (OSError, http.client.HTTPException) as exc:  # connection dropped mid-file
            raise _DownloadFailed(f"interrupted after {part.stat().st_size:,} bytes "
                                  f"({_reason(exc)}); run the command again to "
                                  "resume") from exc
    if total is not None and part.stat().st_size < total:
        raise _DownloadFailed(f"incomplete: got {part.stat().st_size:,} of {total:,} bytes; "
                              "run the command again to resume")


def _by_hand(dataset: RemoteDataset, dest: Path) -> str:
    names = ", ".join(dataset.md5)
    where = f" from {dataset.homepage}" if dataset.homepage else ""
    return f"download {names}{where} by hand and put them in {dest}/ (keep the names)"


def _fetch_file(dataset: RemoteDataset, name: str, md5: str, final: Path,
                mirrors: Sequence[str], timeout: float, progress: Progress,
                task: TaskID) -> None:
    """Download one file into place from the first mirror that delivers a verified copy."""
    part = final.with_name(final.name + ".part")
    failures = []
    for base in mirrors:
        url = _join(base, name)
        # A resumed file that fails its checksum may have begun as a different file
        # (e.g. an old partial download): start it afresh once before giving up.
        for _attempt in range(2 if part.exists() else 1):
            try:
                _download(url, part, timeout=timeout, progress=progress, task=task)
            except _DownloadFailed as exc:
                failures.append(f"{url}: {exc}")
                break
            got = file_md5(part)
            if got == md5:
                os.replace(part, final)
                log.info("%s: downloaded from %s, checksum ok", final, url)
                return
            part.unlink()  # a wrong file must not be resumed from or kept
            failures.append(f"{url}: checksum mismatch (md5 {got}, expected {md5})")
    if part.exists() and part.stat().st_size == 0:
        part.unlink()
    raise CapsmedError(f"{final}: cannot fetch {dataset.name} file ({'; '.join(failures)}); "
                       f"{_by_hand(dataset, final.parent)}")


def fetch_dataset(dataset: RemoteDataset, dest: Path, *, mirror: str | None = None,
                  timeout: float = DEFAULT_TIMEOUT,
                  disable_progress: bool | None = None) -> list[Path]:
    """Download every file of ``dataset`` into ``dest``, verifying each MD5.

    Args:
        dataset: The files, their checksums and mirrors.
        dest: Folder to download into (created if missing).
        mirror: Base URL to use instead of the built-in mirrors.
        timeout: Seconds to wait for a server before giving up on it.
        disable_progress: Hide the progress bar (None: follow the global setting).

    Returns:
        The paths of all files, downloaded or already present.

    Raises:
        CapsmedError: a file could not be downloaded from any mirror, or its checksum
            did not match (the bad file is deleted); the message says how to place
            the files by hand.
    """
    if mirror is not None and urllib.parse.urlsplit(mirror).scheme not in (
            "http", "https", "ftp", "file"):
        raise CapsmedError(f"--mirror {mirror}: not a URL (give a base URL such as "
                           "https://host/path/ or file:///folder/)")
    if not 0 < timeout < math.inf:  # inf: a traceback from the socket
        raise CapsmedError(f"--timeout must be > 0 seconds (a finite number), got {timeout}")
    dest = Path(dest)
    made = not dest.exists()
    ensure_writable_dir(dest)
    mirrors: Sequence[str] = (mirror,) if mirror else dataset.mirrors
    paths = []
    try:
        with make_progress(DownloadColumn(), TransferSpeedColumn(),
                           disable=disable_progress) as progress:
            for name, md5 in dataset.md5.items():
                final = dest / name
                paths.append(final)
                if final.exists():
                    if file_md5(final) == md5:
                        log.info("%s: present, checksum ok; skipped", final)
                        continue
                    log.warning("%s: present but its checksum is wrong; downloading "
                                "again", final)
                task = progress.add_task(name, total=None)
                _fetch_file(dataset, name, md5, final, mirrors, timeout, progress, task)
    except BaseException:
        if made and dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()  # nothing came: leave no empty folder behind
        raise
    return paths
