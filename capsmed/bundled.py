"""The files a capsmed install carries besides its code: the studies (``pipelines/``)
and the examples (``examples/``).

They live at the repository's root; the wheel carries them inside the package, as
``capsmed/_bundled/<kind>/`` (``setup.py``). A checkout or an editable install has no
such folder, and reads the root's, so that an edited study runs as edited.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def bundled_folder(kind: str) -> Path | None:
    """The folder of ``kind`` ("pipelines" or "examples") this capsmed carries: the
    wheel's copy, else the checkout's; None where there is neither."""
    for folder in (PACKAGE / "_bundled" / kind, PACKAGE.parent / kind):
        if folder.is_dir():
            return folder
    return None


def bundled_pipelines() -> dict[str, Path]:
    """The bundled studies by name (``smoke`` -> ``.../pipelines/smoke.yaml``), sorted."""
    folder = bundled_folder("pipelines")
    if folder is None:
        return {}
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}
