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


# ---- no bare Any where the API knows the type ---------------------------------------------------
#: parameter names whose type pycudnn knows: a bare ``Any`` on one of them promises nothing
_TYPED_NAMES = ("dtype", "device", "stream", "input", "weight", "module", "model", "bias")


def _bare_any(hint):
    """Whether ``hint`` is ``Any`` or a union with ``Any`` in it (``Any | None``)."""
    if hint is typing.Any:
        return True
    return typing.get_origin(hint) is typing.Union and typing.Any in typing.get_args(hint)


def _untyped(name, fn, check_return):
    hints = typing.get_type_hints(fn)
    bad = [f"{name}({p})" for p, hint in hints.items()
           if p != "return" and any(key in p for key in _TYPED_NAMES) and _bare_any(hint)]
    if check_return and _bare_any(hints.get("return")):
        bad.append(f"{name} -> Any")
    return bad


def _torch_public_callables(module):
    seen = []
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            seen += [(f"{name}.{attr}", member) for attr, member in vars(obj).items()
                     if inspect.isfunction(member) and (not attr.startswith("_") or attr in _DUNDERS)]
        elif inspect.isfunction(obj):
            seen.append((name, obj))
    return seen


def test_the_checker_flags_bare_any():
    def loose(dtype: typing.Any, stream: typing.Optional[typing.Any] = None,
              other: typing.Any = None) -> typing.Any: ...

    def tight(dtype: pycudnn.DTypeLike, stream: pycudnn.StreamLike | None = None) -> int: ...

    assert _untyped("loose", loose, True) == ["loose(dtype)", "loose(stream)", "loose -> Any"]
    assert _untyped("tight", tight, True) == []


def test_pycudnn_signatures_name_their_types():
    found = _public_callables()
    assert {"empty", "zeros", "from_numpy", "get_handle", "preload", "Tensor.__init__"} <= {
        n for n, _ in found}
    bad = [b for name, fn in found for b in _untyped(name, fn, check_return=False)]
    assert not bad, "public parameters typed Any: " + ", ".join(bad)
    hints = typing.get_type_hints(pycudnn.empty)
    assert hints["dtype"] is pycudnn.DTypeLike
    assert hints["device"] == typing.Optional[pycudnn.DeviceLike]
    assert hints["stream"] == typing.Optional[pycudnn.StreamLike]


def test_pycudnn_torch_signatures_name_torch_types():
    torch = pytest.importorskip("torch")
    import pycudnn.torch as pt

    found = _torch_public_callables(pt)
    assert {"conv2d", "conv1d", "conv_transpose3d", "convert", "revert", "fold_batchnorm",
            "fuse_for_inference", "fuse_for_training", "conversion_report", "FusedConv2d.forward",
            "ConvTranspose2d.forward", "ConvBnAddReLU2d.forward"} <= {n for n, _ in found}
    bad = [b for name, fn in found for b in _untyped(name, fn, check_return=True)]
    assert not bad, "pycudnn.torch signatures typed Any: " + ", ".join(bad)
    hints = typing.get_type_hints(pt.conv2d)
    assert hints["input"] is torch.Tensor and hints["return"] is torch.Tensor
    assert hints["bias"] == typing.Optional[torch.Tensor]
    assert typing.get_type_hints(pt.convert)["module"].__bound__ is torch.nn.Module


def test_the_aliases_accept_what_the_conversions_accept():
    """Each kind of value the aliases name is one the run-time conversion takes."""
    import numpy as np

    from pycudnn._types import normalize_dtype
    from pycudnn.runtime.memory.devices import HasDeviceId
    from pycudnn.runtime.memory.streams import resolve_stream

    class Array:
        dtype = np.dtype("float16")

    for value in ("float32", np.dtype("float64"), np.float16, float, Array()):
        assert normalize_dtype(value).name in ("float32", "float64", "float16")

    class Device:
        device_id = 0

    assert typing.get_args(pycudnn.DeviceLike) == (typing.SupportsIndex, HasDeviceId)
    assert Device().device_id == 0

    class Stream:
        def __cuda_stream__(self):
            return (0, 7)

    assert resolve_stream(Stream()) == 7 and resolve_stream(5) == 5


def test_importing_pycudnn_types_does_not_import_torch():
    code = ("import sys, typing, pycudnn; pycudnn.DTypeLike, pycudnn.DeviceLike, pycudnn.StreamLike; "
            "typing.get_type_hints(pycudnn.empty); typing.get_type_hints(pycudnn.get_handle); "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
