"""The package's layering, checked: every module imports only from its own layer or below, the
imports have no cycle, and docs/architecture.md lists every module in the layer it is in here.

A folder of the package is one layer; the modules at the top are the foundation (below every
folder) or the entry points (above every folder). Imports are read from the source (ast):
``import``, ``from ... import`` and ``importlib.import_module("...")`` with a literal name, at the
top of a module and inside functions alike. No upward import is allowed, not even a lazy one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pycudnn"

#: bottom to top: (layer, top-level modules, folders); a module may import from its own layer
#: and the layers below
LAYERS: list[tuple[str, list[str], list[str]]] = [
    ("foundation", ["errors", "_logging", "_live", "_types", "_version", "configuration"], []),
    ("C boundary", [], ["ffi"]),
    ("CUDA resources and views", [], ["runtime"]),
    ("cuDNN objects", [], ["cudnn"]),
    ("the problem and its engines", [], ["engines"]),
    ("what survives the process", [], ["tuning"]),
    ("choosing a record", [], ["search"]),
    ("operations", [], ["api", "ops"]),
    ("entry points", ["__main__", "__init__"], ["torch", "cli", "cupy_compat"]),
]


def _module_name(path: Path) -> str:
    """'engines.v7' for pycudnn/engines/v7.py, 'ffi' for pycudnn/ffi/__init__.py."""
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


MODULES = sorted(_module_name(p) for p in PKG.rglob("*.py"))
#: every package inside pycudnn (a layer's folder, or a package within one, e.g. runtime.tensor)
PACKAGES = sorted(_module_name(p) for p in PKG.rglob("__init__.py") if p.parent != PKG)


def _layer(module: str) -> int:
    top = module.split(".")[0]
    for i, (_, mods, folders) in enumerate(LAYERS):
        if (module in mods and "." not in module) or top in folders:
            return i
    raise KeyError(module)


def _resolve(base: list[str], names: list[str]) -> list[str]:
    """Modules an import of ``names`` from package ``base`` (path parts inside pycudnn) reaches."""
    out = []
    for name in names:
        parts = base + [name]
        dotted = ".".join(parts)
        if (PKG / (dotted.replace(".", "/") + ".py")).exists() or dotted in PACKAGES:
            out.append(dotted)
        elif base:
            out.append(".".join(base) or "__init__")
        else:
            out.append("__init__")
    return out


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported pycudnn module, line) for each import."""
    tree = ast.parse(path.read_text())
    here = list(path.relative_to(PKG).parts[:-1])  # the package this module is in
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
            mod = node.module.split(".") if node.module else []
            names = [a.name for a in node.names]
            targets = _resolve(base + mod[:-1], [mod[-1]]) if mod else _resolve(base, names)
            if mod and names:  # 'from .pkg import module' reaches the module
                sub = _resolve(base + mod, names)
                targets = [t for t in sub if t != ".".join(base + mod)] or targets
            out += [(t, node.lineno) for t in targets]
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module == "pycudnn" or node.module.startswith("pycudnn.")):
            mod = node.module.split(".")[1:]
            names = [a.name for a in node.names]
            targets = _resolve(mod[:-1], [mod[-1]]) if mod else _resolve([], names)
            out += [(t, node.lineno) for t in targets]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                mod = alias.name.split(".")
                if mod[0] == "pycudnn":
                    out += [(t, node.lineno) for t in
                            (_resolve(mod[1:-1], [mod[-1]]) if len(mod) > 1 else ["__init__"])]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            spec = str(node.args[0].value)
            level = len(spec) - len(spec.lstrip("."))
            mod = spec.lstrip(".").split(".")
            base = here[:len(here) - (level - 1)] if level > 1 else here
            if spec.startswith("pycudnn."):
                base, mod = [], mod[1:]
            if mod != [""]:
                out += [(t, node.lineno) for t in _resolve(base + mod[:-1], [mod[-1]])]
    return [(m, line) for m, line in out if m != _module_name(path)]


def test_every_module_has_a_layer():
    unplaced = []
    for m in MODULES:
        try:
            _layer(m)
        except KeyError:
            unplaced.append(m)
    assert not unplaced, "put new top-level modules and folders in LAYERS and docs/architecture.md"


@pytest.mark.parametrize("module", MODULES)
def test_imports_go_down_the_layers(module):
    upward = []
    for target, line in _imports(_path(module)):
        if _layer(target) > _layer(module) and module != "__init__":
            upward.append(f"{module}:{line} imports {target} "
                          f"({LAYERS[_layer(target)][0]} is above {LAYERS[_layer(module)][0]})")
    assert not upward, "\n".join(upward)


def _path(module: str) -> Path:
    p = PKG / (module.replace(".", "/") + ".py")
    return p if p.exists() else PKG / module.replace(".", "/") / "__init__.py"


def test_no_import_cycles():
    graph = {m: {t for t, _ in _imports(_path(m))}
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
        for m in re.findall(r"`([\w/]+)\.py`", cell):
            documented[m.replace("/", ".")] = int(layer)
    modules = {m: _layer(m) for m in MODULES if m not in PACKAGES}
    assert documented == modules, {m: (documented.get(m), modules.get(m))
                                   for m in set(documented) | set(modules)
                                   if documented.get(m) != modules.get(m)}


def _private_uses(path: Path) -> list[str]:
    """Private names of other pycudnn modules this module reaches: ``from .m import _x`` and
    ``m._x`` where ``m`` is a pycudnn module it imported."""
    tree = ast.parse(path.read_text())
    here = _module_name(path)
    modules: set[str] = set()  # local names bound to pycudnn modules
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("pycudnn")):
            for alias in node.names:
                name = alias.asname or alias.name
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    target = ".".join(filter(None, [node.module or "", alias.name]))
                    if not (PKG / (target.replace(".", "/") + ".py")).exists():
                        out.append(f"{here}:{node.lineno} imports {alias.name} from {node.module}")
                if (PKG / (((node.module or "").replace(".", "/") + "/" if node.module else "")
                           + alias.name + ".py")).exists() \
                        or (PKG / alias.name).is_dir():
                    modules.add(name)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            out.append(f"{here}:{node.lineno} uses {node.value.id}.{node.attr}")
    return out


def test_no_private_names_used_across_modules():
    """Production code reaches other modules through their public names only (the layers' own
    private modules, _types/_live/_logging, are imported by name and used by their public names)."""
    found = []
    for m in MODULES:
        found += _private_uses(_path(m))
    assert not found, "\n".join(found)
