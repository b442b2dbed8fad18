"""pycudnn.current_stream without a GPU: framework detection and stream lookup, with stand-in
framework modules where the real ones are absent."""

from __future__ import annotations

import sys
import types

import pytest

import pycudnn
from pycudnn.runtime import interop


def _fake_class(module: str, name: str = "Thing", **attrs):
    cls = type(name, (), attrs)
    cls.__module__ = module
    return cls


def test_exported():
    assert pycudnn.current_stream is interop.current_stream
    assert "current_stream" in pycudnn.__all__


@pytest.mark.parametrize("module, expected", [
    ("torch", "torch"), ("torch.cuda.streams", "torch"), ("cupy", "cupy"),
    ("cupy.cuda.stream", "cupy"), ("cupy_backends.cuda", "cupy"),
    ("numba.cuda.cudadrv.devicearray", "numba"), ("numba_cuda.numba.cuda.cudadrv.devicearray", "numba"),
    ("jaxlib.xla_extension", "jax"), ("cuda.core._stream", "cuda.core"), ("pycudnn.runtime.tensor", "pycudnn"),
    ("numpy", None), ("builtins", None),
])
def test_framework_of(module, expected):
    assert interop.framework_of(_fake_class(module)()) == expected


def test_plain_values():
    assert pycudnn.current_stream(None) == 0
    assert pycudnn.current_stream(0) == 0
    assert pycudnn.current_stream(2) == 2
    assert pycudnn.current_stream(0x7F00) == 0x7F00
    assert pycudnn.current_stream("pycudnn") == 0
    assert pycudnn.current_stream("cuda.core") == 0
    t = pycudnn.tensor_from_pointer(0x1000, (2, 3), "float32")
    assert pycudnn.current_stream(t) == 0
    with pytest.raises(ValueError, match="unknown framework 'tensorflow'"):
        pycudnn.current_stream("tensorflow")
    with pytest.raises(TypeError, match="bool"):
        pycudnn.current_stream(True)
    with pytest.raises(ValueError, match="non-negative"):
        pycudnn.current_stream(-1)


def test_stream_objects():
    Proto = _fake_class("somelib", "Stream", __cuda_stream__=lambda self: (0, 0x1234))
    assert pycudnn.current_stream(Proto()) == 0x1234
    TorchStream = _fake_class("torch.cuda.streams", "Stream", cuda_stream=0x55)
    assert pycudnn.current_stream(TorchStream()) == 0x55
    CupyStream = _fake_class("cupy.cuda.stream", "Stream", ptr=0x66)
    assert pycudnn.current_stream(CupyStream()) == 0x66


def test_cuda_array_interface_stream():
    Arr = _fake_class("otherlib", "Array")
    Arr.__cuda_array_interface__ = property(lambda self: self.cai)
    a = Arr()
    a.cai = {"shape": (1,), "typestr": "<f4", "data": (0x10, False), "version": 3, "stream": 0x99}
    assert pycudnn.current_stream(a) == 0x99
    a.cai = dict(a.cai, stream=None)
    assert pycudnn.current_stream(a) == 0
    a.cai = dict(a.cai, version=2, stream=0x99)  # version 2 has no stream
    assert pycudnn.current_stream(a) == 0


def test_unknown_and_jax_objects():
    with pytest.raises(TypeError, match="cannot tell the stream"):
        pycudnn.current_stream(object())
    Jax = _fake_class("jaxlib.xla_extension", "ArrayImpl")
    with pytest.raises(TypeError, match="JAX does not expose"):
        pycudnn.current_stream(Jax())


def test_torch_lookups(monkeypatch):
    calls = []

    class Stream:
        def __init__(self, handle):
            self.cuda_stream = handle

    class Tensor:
        is_cuda = True
        device = "cuda:1"

    Tensor.__module__ = "torch"

    def current_stream(device=None):
        calls.append(device)
        return Stream(0xABC)

    fake = types.SimpleNamespace(Tensor=Tensor, cuda=types.SimpleNamespace(current_stream=current_stream))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert pycudnn.current_stream("torch") == 0xABC
    assert pycudnn.current_stream("PyTorch") == 0xABC
    assert pycudnn.current_stream(Tensor()) == 0xABC
    assert calls == [None, None, "cuda:1"]
    cpu = Tensor()
    cpu.is_cuda, cpu.device = False, "cpu"
    with pytest.raises(TypeError, match="not a CUDA device"):
        pycudnn.current_stream(cpu)


def test_cupy_lookups(monkeypatch):
    devices = []

    class Device:
        def __init__(self, i):
            self.i = i

        def __enter__(self):
            devices.append(self.i)

        def __exit__(self, *exc):
            return None

    cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=0xC0),
                                 Device=Device)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))

    class ndarray:
        __cuda_array_interface__ = {"version": 3, "stream": 0x1}
        device = types.SimpleNamespace(id=1)

    ndarray.__module__ = "cupy"
    assert pycudnn.current_stream("cupy") == 0xC0
    assert pycudnn.current_stream(ndarray()) == 0xC0
    assert devices == [1]


def test_numba_lookups(monkeypatch):
    class CtypesHandle:
        value = 0xD0

    class Stream:
        handle = CtypesHandle()

    class DefaultStream:
        handle = types.SimpleNamespace(value=None)  # numba's default stream: a null handle

    Stream.__module__ = DefaultStream.__module__ = "numba.cuda.cudadrv.driver"

    class DeviceNDArray:
        __cuda_array_interface__ = {"version": 3}

        def __init__(self, stream):
            self.stream = stream

    DeviceNDArray.__module__ = "numba.cuda.cudadrv.devicearray"
    cuda_mod = types.ModuleType("numba.cuda")
    cuda_mod.default_stream = lambda: DefaultStream()
    numba_mod = types.ModuleType("numba")
    numba_mod.cuda = cuda_mod
    monkeypatch.setitem(sys.modules, "numba", numba_mod)
    monkeypatch.setitem(sys.modules, "numba.cuda", cuda_mod)
    assert pycudnn.current_stream("numba") == 0
    assert pycudnn.current_stream(DeviceNDArray(Stream())) == 0xD0
    assert pycudnn.current_stream(DeviceNDArray(0)) == 0
    assert pycudnn.current_stream(Stream()) == 0xD0


def test_missing_framework(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes "import torch" fail
    with pytest.raises(ValueError, match="torch is not installed"):
        pycudnn.current_stream("torch")
