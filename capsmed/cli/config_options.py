"""A command's options generated from the typed config dataclass it fills.

Each field of the config becomes ``--field-name`` (a ``--x/--no-x`` pair for a bool),
with the field's type, the help text of its ``Attributes:`` entry in the dataclass
docstring and its default in brackets, read from the dataclass: an option is written
once, as a field, instead of three times (the command's signature, the call that
builds the config, the config). Every option defaults to None and only overrides
(STYLE 4). ``capsmed train`` is built this way (``tests/faults/test_option_defaults.py``
checks each shown default against the dataclass).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import typer

from capsmed.cli.options import field_default, show_value


@dataclass(frozen=True)
class Extra:
    """What a command says of one field beyond the dataclass.

    Attributes:
        help: Help text instead of the docstring's (no default in it).
        decls: More flag names (``--augment-spec``).
        cli_type: The type typed on the command line when it differs from the field's
            (``imbalance``: a ``CLASS=PCT,...`` string).
        parse: Turns that value into the field's value.
        meaning: What a None default means, shown in brackets (``[the domain's]``).
        metavar: The value's name in ``--help`` when the cli_type's would mislead
            (``<int|none>`` for a number typed as text).
    """

    help: str | None = None
    decls: tuple[str, ...] = ()
    cli_type: Any = None
    parse: Callable[[Any], Any] | None = None
    meaning: str | None = None
    metavar: str | None = None


@dataclass(frozen=True)
class ConfigOption:
    """One generated option: the field it sets and its Typer parameter."""

    name: str
    parameter: inspect.Parameter
    parse: Callable[[Any], Any] | None = field(default=None, compare=False)


def attribute_help(config: type) -> dict[str, str]:
    """The ``Attributes:`` entries of ``config``'s Google-style docstring, each on one
    line with reST markup removed (``x`` and :mod:`x` become x)."""
    doc = inspect.cleandoc(config.__doc__ or "")
    section = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
    entries: dict[str, str] = {}
    name = None
    for line in section.splitlines():
        match = re.match(r"^ {4}(\w+)(?:, \w+)*: (.*)$", line)
        if match:
            name = match.group(1)
            entries[name] = match.group(2)
        elif name and line.startswith("        "):
            entries[name] += " " + line.strip()
        elif line.strip():
            break  # the section has ended
    return {k: _plain(v) for k, v in entries.items()}


def _plain(text: str) -> str:
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text)
    text = text.replace("``", "")
    return " ".join(text.split()).rstrip(".")


def _cli_type(hint: Any) -> Any:
    """The command-line type of a field's annotation (``int | None`` -> ``int``)."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _cli_type(args[0]) if len(args) == 1 else str
    return hint


def config_options(config: type, *, skip: tuple[str, ...] = (),
                   extras: Mapping[str, Extra] | None = None) -> list[ConfigOption]:
    """``--field`` options for every field of ``config`` but ``skip`` (fields of a
    type the command line cannot hold, dicts and lists, need an :class:`Extra` with a
    ``cli_type`` and ``parse``)."""
    extras = extras or {}
    hints = typing.get_type_hints(config)
    docs = attribute_help(config)
    out = []
    for f in dataclasses.fields(config):
        if f.name in skip:
            continue
        extra = extras.get(f.name, Extra())
        kind = extra.cli_type or _cli_type(hints[f.name])
        if kind in (dict, list) or typing.get_origin(kind) in (dict, list):
            raise TypeError(f"{config.__name__}.{f.name}: give it a cli_type or skip it")
        flag = "--" + f.name.replace("_", "-")
        decls = (f"{flag}/--no-{flag[2:]}",) if kind is bool else (flag, *extra.decls)
        text, said = _none_clause(extra.help or docs.get(f.name) or f.name)
        default = _default(config, f.name)
        meaning = extra.meaning or said
        if kind is bool:
            shown = (flag[2:] if default else f"no-{flag[2:]}") if default is not None \
                else meaning
        else:
            shown = show_value(default) if default not in (None, {}, [], ()) else meaning
        help_text = f"{text} [{shown}]." if shown is not None else f"{text}."
        option = typer.Option(None, *decls, help=help_text, show_default=False,
                              **({"metavar": extra.metavar} if extra.metavar else {}))
        out.append(ConfigOption(f.name, inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind),
            extra.parse))
    return out


def _none_clause(text: str) -> tuple[str, str | None]:
    """The docstring's "None = X" clause (what an unset field means) taken out of the
    help text, to be shown as the bracketed default instead."""
    match = re.search(r"[;,]?\s*None = ([^.;]*)", text)
    if match is None:
        return text.rstrip("."), None
    rest = (text[:match.start()] + text[match.end():]).strip().rstrip(".;,")
    return rest, match.group(1).strip()


def _default(config: type, name: str) -> Any:
    try:
        return field_default(config, name)
    except KeyError:  # a required field
        return None


def with_options(options: list[ConfigOption]) -> Callable[[Callable[..., Any]], Any]:
    """Give a command the generated ``options`` as keyword parameters, after its own;
    the command receives them in one mapping argument named ``options`` (the given
    ones only, parsed)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(command)  # the command module's names
        own = [p.replace(annotation=hints.get(p.name, p.annotation),
                         kind=inspect.Parameter.KEYWORD_ONLY)
               for p in inspect.signature(command).parameters.values()
               if p.name != "options"]
        names = {o.name for o in options}

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            given = {o.name: (o.parse(kwargs[o.name]) if o.parse else kwargs[o.name])
                     for o in options if kwargs.get(o.name) is not None}
            rest = {k: v for k, v in kwargs.items() if k not in names}
            return command(**rest, options=given)

        wrapper.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [*(o.parameter for o in options), *own])
        wrapper.__annotations__ = {
            **{p.name: p.annotation for p in own},
            **{o.name: o.parameter.annotation for o in options}}
        return wrapper

    return decorate
