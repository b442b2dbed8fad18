"""Type hints on the whole public API, the py.typed marker, and mypy's verdict (when installed)."""

from __future__ import annotations

import importlib.util
import inspect
import pathlib
import subprocess
import sys
import typing

import pytest

import pycudnn

ROOT = pathlib.Path(__file__).resolve().parent.parent
_DUNDERS = ("__init__", "__call__", "__enter__", "__exit__")


def _public_callables():
    """(name, function) for everything ``pycudnn`` exports, their public methods and properties,
    and the public functions of the modules that are used by name (cupy_compat, interop)."""
    from pycudnn import _logging, cupy_compat
    from pycudnn.runtime import interop

    seen = []
    for name in pycudnn.__all__:
        if name == "__version__":
            continue
        obj = getattr(pycudnn, name)
        if inspect.isclass(obj):
            if issubclass(obj, BaseException):
                continue  # exceptions: constructors documented by their messages
            for attr, member in vars(obj).items():
                if attr.startswith("_") and attr not in _DUNDERS:
                    continue
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, property):
                    member = member.fget
                if inspect.isfunction(member):
                    seen.append((f"{name}.{attr}", member))
        elif inspect.isfunction(obj) or hasattr(obj, "__wrapped__"):
            seen.append((name, obj))
    for module in (cupy_compat, interop, _logging):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                seen.append((f"{module.__name__}.{name}", obj))
    return seen


def test_py_typed_marker_is_shipped():
    assert (ROOT / "pycudnn" / "py.typed").is_file()
    assert 'pycudnn = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()


def test_every_public_callable_is_annotated():
    missing = []
    found = _public_callables()
    assert len(found) > 40
    for name, fn in found:
        sig = inspect.signature(fn)
        for p in sig.parameters.values():
            if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty:
                missing.append(f"{name}({p.name})")
        if sig.return_annotation is inspect.Signature.empty and not name.endswith("__init__"):
            missing.append(f"{name} -> ?")
    assert not missing, "public callables without type hints: " + ", ".join(missing)


@pytest.mark.parametrize("module", ["pycudnn.cupy_compat", "pycudnn.runtime.interop", "pycudnn._logging",
                                    "pycudnn.errors", "pycudnn.configuration"])
def test_annotations_resolve(module):
    mod = importlib.import_module(module)
    for name, obj in vars(mod).items():
        if inspect.isfunction(obj) and obj.__module__ == module:
            typing.get_type_hints(obj)  # raises on a misspelt or missing name


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="could not import 'mypy' (not installed)")
def test_mypy_passes():
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
