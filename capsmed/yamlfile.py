"""YAML as capsmed reads it: ``safe_load`` (no Python objects), and a key given twice in
one mapping refused. PyYAML keeps the last of two equal keys without a word, so a
pipeline or config with ``epochs: 1`` and later ``epochs: 3`` trained 3 epochs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from capsmed.errors import CapsmedError

# libyaml's parser where PyYAML was built with it: the same documents (errors worded by
# libyaml), about 7x faster on a run's config.yaml (a study reads thousands of them)
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    """``yaml.SafeLoader`` whose mappings refuse a repeated key."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:  # on another line, or twice in one {a: 1, a: 2}
                    raise DuplicateKey(key, seen[key], line)
                seen[key] = line
            except TypeError:  # an unhashable key: the base class explains it
                break
        return super().construct_mapping(node, deep=deep)


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, again: int) -> None:
        super().__init__(f"line {again}: key '{key}' is given twice in one mapping (first "
                         f"on line {first}); the second would silently replace the "
                         "first: keep one")


def load_yaml(text: str, origin: object) -> Any:
    """Parse ``text`` (read from ``origin``, named in errors) like ``yaml.safe_load``.

    Raises:
        CapsmedError: ``"<origin>: line N: key 'k' is given twice ..."`` for a repeated
            key; other YAML errors propagate as ``yaml.YAMLError`` for the caller to
            word.
    """
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader
    except DuplicateKey as exc:
        raise CapsmedError(f"{origin}: {exc}") from None


def read_yaml(path: Path) -> Any:
    """:func:`load_yaml` of a UTF-8 file."""
    return load_yaml(Path(path).read_text(encoding="utf-8"), path)
