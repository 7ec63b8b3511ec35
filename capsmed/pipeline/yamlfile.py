"""Reading a pipeline file: UTF-8 text, parsed by :func:`capsmed.yamlfile.load_yaml`
(safe, a key given twice refused), every problem one line naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from capsmed.errors import CapsmedError
from capsmed.yamlfile import load_yaml


def read_pipeline_yaml(path: Path) -> Any:
    """The YAML document in ``path``; a :class:`CapsmedError` when it cannot be read,
    is not UTF-8 text, is not valid YAML or repeats a key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CapsmedError(f"{path}: cannot read pipeline ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise CapsmedError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
                           f"on line {line}); save the pipeline as UTF-8") from None
    try:
        return load_yaml(text, path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise CapsmedError(f"{path}: not valid YAML{where}: {problem}") from None
