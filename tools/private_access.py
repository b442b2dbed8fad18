"""Count the tests' reaches into pycudnn's private names.

    python tools/private_access.py            # per-file counts and the total
    python tools/private_access.py -v         # every access, one a line

Tests reach the package through its public names or its documented test seams (public functions
and attributes whose docstring says they are for tests and tooling, or fixtures in
``tests/conftest.py`` that call one). This script finds, by reading ``tests/*.py`` with ``ast``,
what still goes around them: a name with one leading underscore that belongs to pycudnn, reached
as

* ``from pycudnn.x import _y``,
* ``m._y`` or ``m.Class._y`` where ``m`` is a local name bound to a pycudnn module
  (``import pycudnn.x as m``, ``from pycudnn.x import m``), or the dotted ``pycudnn.x._y``,
* ``monkeypatch.setattr("pycudnn.x._y", ...)``, or ``monkeypatch.setattr(m, "_y", ...)`` (also
  ``delattr``, and the name a loop variable over literal strings) where ``m`` starts from a
  pycudnn module, and the pair ``(m, "_y")`` that a loop patches.

Dunder names do not count, nor do the package's private modules themselves (``_types``,
``_logging``, ``ops/_common.py``...): they are documented layers and are used by their public
names. Code a test runs in a child interpreter, a string literal that imports pycudnn and parses
as Python, is read the same way. ``tests/test_test_seams.py`` keeps the total from growing.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "pycudnn"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` (``pycudnn.x.y``) names a module or package of pycudnn."""
    if dotted != "pycudnn" and not dotted.startswith("pycudnn."):
        return False
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _modules_bound(tree: ast.AST) -> dict[str, str]:
    """Local names bound to pycudnn modules anywhere in ``tree`` (imports at any depth)."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _is_module(alias.name):
                    continue
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if _is_module(f"{node.module}.{alias.name}"):
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _private_in_chain(parts: list[str], bound: dict[str, str]) -> str | None:
    """The first private name a dotted chain reaches from a pycudnn module, as ``module._y``."""
    if parts[0] not in bound:
        return None
    module = bound[parts[0]]
    rest = parts[1:]
    while rest and _is_module(f"{module}.{rest[0]}"):
        module = f"{module}.{rest.pop(0)}"
    if rest and _is_private(rest[0]):
        return f"{module}.{rest[0]}"
    if len(rest) >= 2 and rest[0][:1].isupper() and _is_private(rest[1]):  # a class's
        return f"{module}.{rest[0]}.{rest[1]}"
    return None


def _starts_at_module(node: ast.expr, bound: dict[str, str]) -> str | None:
    parts = _chain(node)
    if parts is None or parts[0] not in bound:
        return None
    return ".".join([bound[parts[0]], *parts[1:]])


def _loop_strings(tree: ast.AST) -> dict[str, list[str]]:
    """Loop variables that run over literal strings: ``for name in ("_a", "_b"):``."""
    out: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name) \
                and isinstance(node.iter, (ast.Tuple, ast.List)):
            values = [e.value for e in node.iter.elts
                      if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(values) == len(node.iter.elts):
                out.setdefault(node.target.id, []).extend(values)
    return out


def _names(node: ast.expr, loops: dict[str, list[str]]) -> list[str]:
    """The attribute names a setattr's second argument can be: a literal, or a loop's strings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name):
        return loops.get(node.id, [])
    return []


def _scan(tree: ast.AST, depth: int = 0) -> list[tuple[int, str]]:
    bound = _modules_bound(tree)
    loops = _loop_strings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and _is_module(node.module):
            for alias in node.names:
                if _is_private(alias.name) and not _is_module(f"{node.module}.{alias.name}"):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("setattr", "delattr") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                parts = first.value.split(".")
                if parts[0] == "pycudnn" and any(_is_private(p) for p in parts):
                    found.append((node.lineno, f"monkeypatch {first.value}"))
            elif len(node.args) >= 2:
                target = _starts_at_module(first, bound)
                for name in _names(node.args[1], loops):
                    if target is not None and _is_private(name):
                        found.append((node.lineno, f"monkeypatch {target}.{name}"))
        if isinstance(node, ast.Tuple) and len(node.elts) == 2 \
                and isinstance(node.elts[1], ast.Constant) and isinstance(node.elts[1].value, str) \
                and _is_private(node.elts[1].value):  # (module, "_y"), patched in a loop
            target = _starts_at_module(node.elts[0], bound)
            if target is not None:
                found.append((node.lineno, f"monkeypatch {target}.{node.elts[1].value}"))
        if depth == 0 and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "pycudnn" in node.value and "import" in node.value:
            try:  # a %-template's holes filled with a value, so the code parses
                inner = ast.parse(re.sub(r"%[rsd]", "0", node.value))
            except SyntaxError:
                continue
            found += [(node.lineno, what) for _, what in _scan(inner, depth + 1)]
    found += _attribute_uses(tree, bound)
    return found


def _attribute_uses(tree: ast.AST, bound: dict[str, str]) -> list[tuple[int, str]]:
    """``m._y`` and ``pycudnn.x._y``: each chain counted once, at its first private name."""
    inner: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            inner.add(id(node.value))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            parts = _chain(node)
            if parts is None:
                continue
            hit = _private_in_chain(parts, bound)
            if hit is not None:
                found.append((node.lineno, hit))
    return found


def private_accesses(path: Path) -> list[tuple[int, str]]:
    """Every private pycudnn name ``path`` reaches, as (line, what), in line order."""
    return sorted(_scan(ast.parse(path.read_text(), str(path))))


def count(tests: Path = ROOT / "tests") -> dict[str, int]:
    """Private accesses per test file (files with none left out)."""
    counts = {}
    for path in sorted(tests.glob("*.py")):
        n = len(private_accesses(path))
        if n:
            counts[path.name] = n
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="list every access")
    args = parser.parse_args(argv)
    total = 0
    for path in sorted((ROOT / "tests").glob("*.py")):
        found = private_accesses(path)
        if not found:
            continue
        total += len(found)
        print(f"{len(found):4d}  tests/{path.name}")
        if args.verbose:
            for line, what in found:
                print(f"        {line}: {what}")
    print(f"{total:4d}  total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
