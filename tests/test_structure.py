"""The package's shape: imports run one way (STYLE 12), no import cycles, and every
registered model provides the interface the trainer relies on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "capsmed"
# Higher layers may import lower ones, never the reverse (inside functions too).
LAYERS = ("cli", "api", "pipeline", "demo", "predict", "evaluate", "runs", "train", "data",
          "models", "base")


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] == "__main__":
        return "cli"  # python -m capsmed: the command line's entry point
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "base"


def _imports() -> dict[str, list[tuple[str, int]]]:
    """capsmed module -> the capsmed modules it imports (anywhere in the file), with
    line numbers; ``from capsmed.x import y`` counts as importing ``capsmed.x.y`` when
    that is a module."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, list[tuple[str, int]]] = {}
    for name, path in modules.items():
        found = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found += [(a.name, node.lineno) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((node.module, node.lineno))
                found += [(f"{node.module}.{a.name}", node.lineno) for a in node.names
                          if f"{node.module}.{a.name}" in modules]
        graph[name] = [(m, line) for m, line in found if m.split(".")[0] == "capsmed"
                       and m in modules and m != name]
    return graph


def test_imports_run_from_higher_layers_to_lower_ones():
    # the package itself is exempt both ways: its face (capsmed/__init__.py) imports the
    # library on first use (capsmed.api), and any module may read capsmed.__version__
    wrong = [f"{name} (line {line}) imports {target}: {_layer(name)} -> {_layer(target)}"
             for name, targets in _imports().items() for target, line in targets
             if "capsmed" not in (name, target)
             and LAYERS.index(_layer(target)) < LAYERS.index(_layer(name))]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    graph = {k: {m for m, _ in v if not (k.startswith(m + ".") or m == "capsmed")}
             for k, v in _imports().items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_every_layer_exists(layer):
    assert (PACKAGE / layer).exists() or (PACKAGE / f"{layer}.py").exists()


@pytest.mark.parametrize("name", [e.name for e in __import__(
    "capsmed.models", fromlist=["list_models"]).list_models()])
def test_every_registered_model_provides_the_interface(name):
    import inspect

    import torch

    from capsmed.models import create_model
    from capsmed.models.common import LOSS_KINDS, CapsmedModel, ModelOutput
    from tests.helpers import TINY

    model = create_model(name, in_channels=1, num_classes=3, input_size=28,
                         **TINY.get(name, {}))
    assert isinstance(model, CapsmedModel) and model.loss_kind in LOSS_KINDS
    assert model.decoder is None or isinstance(model.decoder, torch.nn.Module)
    params = inspect.signature(model.forward).parameters
    assert "target" in params
    assert model.returns_couplings == ("return_couplings" in params)
    x, y = torch.rand(2, 1, 28, 28), torch.tensor([0, 2])
    kwargs = {"return_couplings": True} if model.returns_couplings else {}
    out = model.eval()(x, target=y, **kwargs)
    assert isinstance(out, ModelOutput) and out.scores.shape == (2, 3)
    assert (out.couplings is not None) == model.returns_couplings
    assert (out.reconstruction is not None) == (model.decoder is not None)
