"""The package's layering, checked: every module imports only from its own layer or below, the
imports have no cycle, and docs/architecture.md lists every module in the layer it is in here.

Imports are read from the source (ast), top-level and inside functions alike; the only upward
imports allowed are the compatibility shims that keep earlier import paths working (a module
``__getattr__`` that imports the new home of a moved name on first use).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pycudnn"

#: bottom to top; a module may import from its own layer and the layers below
LAYERS: list[tuple[str, list[str]]] = [
    ("foundation", ["errors", "_logging", "_live", "_types", "configuration"]),
    ("C boundary", ["_lib", "backend"]),
    ("CUDA resources, views and cuDNN objects", ["memory", "handle", "tensor", "interop",
                                                 "descriptors", "graph"]),
    ("the problem", ["problem", "engine", "arguments", "tensor_ops"]),
    ("search and engines", ["tuning_db", "algos", "graph_engine"]),
    ("registry, replay and preloading", ["engines", "prepared", "preloading"]),
    ("public API and tools", ["conv", "repro", "cupy_compat", "cli", "__main__", "__init__"]),
]
LAYER_OF = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported pycudnn module, line, inside a module-level __getattr__ shim) for each import."""
    tree = ast.parse(path.read_text())
    shim_nodes: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            shim_nodes.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        shim = id(node) in shim_nodes
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            out += [(n, node.lineno, shim) for n in names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pycudnn."):
            out.append((node.module.split(".")[1], node.lineno, shim))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            out.append((str(node.args[0].value).lstrip("."), node.lineno, shim))
    return [(m, line, shim) for m, line, shim in out if m != "__version__"]


MODULES = sorted(p.stem for p in PKG.glob("*.py"))


def test_every_module_has_a_layer():
    assert sorted(LAYER_OF) == MODULES, "add new modules to LAYERS and to docs/architecture.md"


@pytest.mark.parametrize("module", MODULES)
def test_imports_go_down_the_layers(module):
    upward = []
    for target, line, shim in _imports(PKG / f"{module}.py"):
        if target not in LAYER_OF or shim:
            continue
        if LAYER_OF[target] > LAYER_OF[module] and module != "__init__":
            upward.append(f"{module}.py:{line} imports {target} "
                          f"({LAYERS[LAYER_OF[target]][0]} is above {LAYERS[LAYER_OF[module]][0]})")
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    graph = {m: {t for t, _, shim in _imports(PKG / f"{m}.py") if not shim and t in LAYER_OF}
             for m in MODULES if m != "__init__"}
    graph = {m: deps - {"__init__"} for m, deps in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(path[path.index(d):] + [m, d]) if d in path else f"{m} -> {d}")
            elif d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, cycles


def test_architecture_doc_lists_every_module_in_its_layer():
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d) [^|]*\| ([^|]+) \|", text, flags=re.M)
    documented = {}
    for layer, cell in rows:
        for m in re.findall(r"`([\w_]+)\.py`", cell):
            documented[m] = int(layer)
    assert documented == LAYER_OF, {m: (documented.get(m), LAYER_OF.get(m))
                                    for m in set(documented) | set(LAYER_OF)
                                    if documented.get(m) != LAYER_OF.get(m)}
