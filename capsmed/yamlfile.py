"""YAML as capsmed reads it: ``safe_load`` (no Python objects), and a key given twice in
one mapping refused. PyYAML keeps the last of two equal keys without a word, so a
pipeline or config with ``epochs: 1`` and later ``epochs: 3`` trained 3 epochs.

Plain words and numbers that YAML 1.1 (PyYAML) reads as another value than they show
are refused too: ``yes``/``no``/``on``/``off`` (booleans: a class, dataset or grid value
``no`` became False, labelled 'False'), ``010`` (octal 8: ``seed: 010`` trained seed 8)
and ``1:30`` (base 60: 90). ``true``/``false`` and quoted text are read as written."""

from __future__ import annotations

import re
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

    def construct_document(self, node: yaml.Node) -> Any:
        _check_scalars(node, "", set())
        return super().construct_document(node)


_TAG = "tag:yaml.org,2002:"
_WORD_BOOLS = {"yes": True, "no": False, "on": True, "off": False}


def _check_scalars(node: yaml.Node, where: str, seen: set[int]) -> None:
    """Refuse a plain scalar below ``node`` that YAML 1.1 reads as another value than
    it shows (``where``: its keys, e.g. ``grid[0].seed[1]``)."""
    if id(node) in seen:  # an alias: checked where its anchor is
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            _check_scalars(key, f"a key of {where}" if where else "a key", seen)
            name = key.value if isinstance(key, yaml.ScalarNode) else "?"
            _check_scalars(value, f"{where}.{name}" if where else str(name), seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_scalars(item, f"{where}[{i}]", seen)
    elif isinstance(node, yaml.ScalarNode) and not node.style:  # plain (libyaml: "")
        problem = _misread(node.tag, node.value)
        if problem:
            raise MisreadScalar(node.start_mark.line + 1, where, node.value, problem)


def _misread(tag: str, text: str) -> str | None:
    """What YAML 1.1 makes of plain ``text`` when that is not what it shows, else None."""
    if tag == _TAG + "bool" and text.lower() in _WORD_BOOLS:
        value = _WORD_BOOLS[text.lower()]
        return f"reads as {str(value).lower()}: write {str(value).lower()}"
    if tag in (_TAG + "int", _TAG + "float") and ":" in text:
        return "reads as a base-60 number (1:30 is 90): write the number itself"
    digits = text.lstrip("+-").replace("_", "")
    if tag == _TAG + "int" and re.fullmatch(r"0[0-7]+", digits) \
            and int(digits, 8) != int(digits):
        return (f"reads as the octal number {int(digits, 8)}, not {int(digits)}: drop "
                "the leading zero")
    return None


class MisreadScalar(yaml.YAMLError):
    def __init__(self, line: int, where: str, text: str, problem: str) -> None:
        super().__init__(f"line {line}{f' ({where})' if where else ''}: YAML 1.1 {text} "
                         f"{problem}, or quote it ('{text}') for the text")


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, again: int) -> None:
        super().__init__(f"line {again}: key '{key}' is given twice in one mapping (first "
                         f"on line {first}); the second would silently replace the "
                         "first: keep one")


def load_yaml(text: str, origin: object) -> Any:
    """Parse ``text`` (read from ``origin``, named in errors) like ``yaml.safe_load``.

    Raises:
        CapsmedError: ``"<origin>: line N: key 'k' is given twice ..."`` for a repeated
            key, ``"<origin>: line N (train.seed): YAML 1.1 010 reads as the octal
            number 8 ..."`` for a plain value read as another than it shows (above);
            other YAML errors propagate as ``yaml.YAMLError`` for the caller to
            word.
    """
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader
    except (DuplicateKey, MisreadScalar) as exc:
        raise CapsmedError(f"{origin}: {exc}") from None


def load_value(text: str, origin: str) -> Any:
    """:func:`load_yaml` of one value typed on a command line (``--set KEY=VALUE``) or in
    an environment variable; invalid YAML is a one-line :class:`CapsmedError` too."""
    try:
        return load_yaml(text, origin)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise CapsmedError(f"{origin}: {text!r} is not a valid YAML value ({problem}); "
                           "quote it for the text") from None


def read_yaml(path: Path) -> Any:
    """:func:`load_yaml` of a UTF-8 file."""
    return load_yaml(Path(path).read_text(encoding="utf-8"), path)
