"""The source registry: every data source capsmed reads, one package each.

A source is a package ``capsmed/data/sources/<name>/`` whose ``__init__`` registers
one :class:`Source` (a package may register several, as ``mnist`` does for the MNIST
family). The registration names, relative to the package, the function that
preprocesses raw files into a dataset file, the one that writes synthetic raw files in
the official layout, and the recipe that replays the preprocessing on new inputs for
``capsmed predict``; and it gives the source's image domain
(:mod:`capsmed.data.domains`), from which training takes its defaults.

Every layer asks this registry, through what a dataset file records
(:func:`source_of`), instead of comparing dataset names. The hooks are imported when
first used, so registering a source costs only its config module (standard library),
which keeps ``capsmed --help`` fast.

A new source: a package folder with ``config.py``, ``reader.py``, ``synth.py`` and
``recipe.py`` plus its ``register(Source(...))`` line in the package's ``__init__``,
and its commands in ``capsmed/cli/sources/<name>.py`` (docs/develop.md).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from capsmed.data.domains import DEFAULT_DOMAIN, DOMAINS, Domain, get_domain
from capsmed.errors import CapsmedError

# what every source's splitting records (capsmed.data.splits, the writer, challenges)
SPLIT_PARAMETERS = frozenset((
    "seed", "workers", "fractions", "split_files", "split_unit", "allow_group_leak",
    "per_class_limit"))


@dataclass(frozen=True)
class Source:
    """One registered data source.

    Attributes:
        name: What its dataset files record as their ``source_kind``; the name of its
            commands (``capsmed preprocess <name>``).
        package: The Python package holding its modules.
        domain: The image domain its files record (``--domain`` may override it where
            ``chooses_domain``).
        config: Its options dataclass (stdlib only, so help texts can read defaults).
        preprocess: ``module:function`` in ``package`` (or a dotted module path from
            another package) turning raw files into a dataset file, called as
            ``function(inputs, output, config, **options)``.
        synth: ``module:function`` writing synthetic raw files in the official
            layout, called as ``function(out_dir, **options)``; None if there is none.
        recipe: ``module:factory`` building predict's recipe, called as
            ``factory(record, overrides)``; None if predict cannot replay the source.
        no_recipe: Why predict cannot replay it (shown when ``recipe`` is None).
        scan_mpp: Microns per pixel of the source's images, where they all share one
            (TUPAC16 at 40x: 0.25); predict warns when a slide is read at another.
        chooses_domain: The user gives the domain (``--domain``): a folder of images or
            a slide set can hold anything.
    """

    name: str
    package: str
    domain: str
    config: type | None = None
    preprocess: str = ""
    synth: str | None = None
    recipe: str | None = None
    no_recipe: str = ""
    scan_mpp: float | None = None
    chooses_domain: bool = False

    def hook(self, which: str) -> Callable[..., Any]:
        """The function named by field ``which`` (``preprocess``, ``synth`` or
        ``recipe``), imported now."""
        target = getattr(self, which)
        if not target:
            raise CapsmedError(f"source '{self.name}' has no {which}"
                               + (f": {self.no_recipe}" if which == "recipe" and
                                  self.no_recipe else ""))
        module, _, attr = target.partition(":")
        if "." not in module:  # a module of the source's own package
            module = f"{self.package}.{module}"
        return getattr(importlib.import_module(module), attr)

    @property
    def split_parameters(self) -> frozenset[str]:
        """The recorded preprocessing parameters that decide which images (or how many)
        go to which split, not how an image looks: two files of this source differing
        only in these hold images made alike (``evaluate --data`` compares the rest).
        The shared ones, plus those its config names as ``SPLIT_ONLY``."""
        return SPLIT_PARAMETERS | getattr(self.config, "SPLIT_ONLY", frozenset())


_REGISTRY: dict[str, Source] = {}
_loaded = False


def register(source: Source) -> Source:
    """Add ``source`` to the registry (once per name); returns it."""
    get_domain(source.domain)  # a typo fails at import, naming the known domains
    known = _REGISTRY.get(source.name)
    if known is not None and known != source:
        raise CapsmedError(f"source '{source.name}' is registered twice ({known.package} "
                           f"and {source.package})")
    _REGISTRY[source.name] = source
    return source


def load_sources() -> None:
    """Import every source package here, so each registers itself (once)."""
    global _loaded
    if _loaded:
        return
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg):
        importlib.import_module(f"{__name__}.{module}")
    _loaded = True


def sources() -> list[Source]:
    """Every registered source, by name."""
    load_sources()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def get_source(name: str) -> Source:
    """The source registered as ``name``, or a one-line refusal listing them."""
    load_sources()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise CapsmedError(f"unknown data source '{name}' (known: "
                           f"{', '.join(sorted(_REGISTRY))})") from None


def source_of(kind: str | None, dataset: str, preprocessing: Mapping[str, Any],
              origin: object) -> Source:
    """The source that wrote a dataset file (or a run's record of one).

    Files record it (``source_kind``). Files written before they did are recognised as
    they were before: a registered dataset name, or a class-folder set by its
    ``scale16`` parameter.

    Raises:
        CapsmedError: naming ``origin`` when neither tells.
    """
    load_sources()
    if kind is None:
        kind = dataset if dataset in _REGISTRY else "folder" if "scale16" in \
            preprocessing else None
    if kind is None or kind not in _REGISTRY:
        raise CapsmedError(f"{origin}: written by an unknown data source "
                           f"'{kind or dataset}' (known: {', '.join(sorted(_REGISTRY))})")
    return _REGISTRY[kind]


def domain_of(kind: str | None, domain: str | None, dataset: str,
              preprocessing: Mapping[str, Any], origin: object) -> Domain:
    """The image domain a file records; for files written before domains were recorded,
    its source's (a class-folder or slide set: generic)."""
    if domain is None:
        source = source_of(kind, dataset, preprocessing, origin)
        domain = DEFAULT_DOMAIN if source.chooses_domain else source.domain
    if domain not in DOMAINS:
        raise CapsmedError(f"{origin}: unknown image domain '{domain}' (known: "
                           f"{', '.join(DOMAINS)}); was it written by a newer capsmed?")
    return DOMAINS[domain]
