"""Reading a pipeline file: safe YAML, UTF-8, and no key given twice.

PyYAML keeps the last of two equal keys without a word (``epochs: 1`` then
``epochs: 3`` trains 3 epochs), so a mapping that repeats a key is refused, naming
both lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from capsmed.errors import CapsmedError


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.setdefault(key, line)
            except TypeError:  # an unhashable key: PyYAML's own error says so
                continue
            if first != line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' is given twice (lines {first} and {line})",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path, what: str = "pipeline") -> Any:
    """The YAML document in ``path``; a one-line :class:`CapsmedError` naming the file
    when it cannot be read, is not UTF-8 text, is not valid YAML or repeats a key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CapsmedError(f"{path}: cannot read {what} ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise CapsmedError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
                           f"on line {line}); save the {what} as UTF-8") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise CapsmedError(f"{path}: not valid YAML{where}: {problem}") from None
