"""CPU tests of the one call path of the public convolution functions (`pycudnn.api.conv`).

A first call runs the function's full path and remembers what it prepared; a repeated call with
the same signature launches that, and a launch that fails falls back to the full path. The
engine is a scripted stand-in (the search, caches and prepared launches are pycudnn's own); the
tensors are views of made-up device addresses that are never touched.
"""

from __future__ import annotations

import numpy as np
import pytest

import pycudnn
from pycudnn.api import call as call_module
from pycudnn.api import conv as C
from pycudnn.api import prepared as P
from pycudnn.engines import registry
from pycudnn.runtime.tensor import tensor_from_pointer
from scripted_engine import ScriptedEngine

F32 = np.dtype("float32")


class _Record:
    workspace = 0
    time_ms = -1.0
    source = "test"

    def describe(self) -> str:
        return "a scripted record"


class _Engine(ScriptedEngine):
    """Runs (the full path) and launches (a remembered call) by recording them."""

    name = "graph"

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.launches: list[tuple[int, ...]] = []
        self.fail_launch = False

    def supports(self, epilogue: str) -> bool:
        return True

    def candidates(self, args):
        return [_Record()]

    def run(self, args, record) -> None:
        self.runs.append(args.params.direction)

    def launch(self, params, record, handle, pointers, stream) -> None:
        if self.fail_launch:
            raise pycudnn.CudnnError(8, "cudnnBackendExecute", "scripted failure")
        self.launches.append(pointers)


@pytest.fixture
def engine(monkeypatch):
    eng = _Engine()
    monkeypatch.setitem(registry.ENGINES, "graph", eng)
    for module in (C, call_module, P):
        if hasattr(module, "get_handle"):
            monkeypatch.setattr(module, "get_handle", lambda *a, **k: 0x1234)
    for module in (C, P):
        monkeypatch.setattr(module, "callers_device", lambda: None)
    monkeypatch.setattr(P, "restore_device", lambda prev: None)
    monkeypatch.setattr(C, "restore_device", lambda prev: None)
    pycudnn.clear_caches()
    yield eng
    pycudnn.clear_caches()


def T(ptr: int, *shape: int):
    return tensor_from_pointer(ptr, shape, F32, device=0)


X, W = T(0x10000000, 2, 4, 8, 8), T(0x20000000, 6, 4, 3, 3)
FLAGS = {"engine": "graph", "tuning_db": False, "benchmark": False}


def test_a_repeated_call_launches_what_the_first_prepared(engine):
    out = T(0x30000000, 2, 6, 6, 6)
    assert pycudnn.convolution(X, W, out=out, **FLAGS) is out
    assert engine.runs == ["forward"] and engine.launches == []
    assert pycudnn.convolution(X, W, out=out, **FLAGS) is out
    assert engine.runs == ["forward"]  # no search, no full path
    assert engine.launches == [(X.ptr, W.ptr, out.ptr)]


def test_a_failed_remembered_launch_takes_the_full_path_and_forgets_it(engine):
    out = T(0x30000000, 2, 6, 6, 6)
    pycudnn.convolution(X, W, out=out, **FLAGS)
    before = len(P.remembered_calls())
    engine.fail_launch = True
    assert pycudnn.convolution(X, W, out=out, **FLAGS) is out
    assert engine.runs == ["forward", "forward"]  # the fallback ran the full path again
    assert len(P.remembered_calls()) == before  # forgotten, then the full path re-prepared it


def test_an_out_overlapping_the_input_on_a_remembered_signature_is_refused_by_the_full_path(engine):
    out = T(0x30000000, 2, 6, 6, 6)
    pycudnn.convolution(X, W, out=out, **FLAGS)
    overlapping = T(X.ptr, 2, 6, 6, 6)
    with pytest.raises(ValueError, match="conv2d: out overlaps input, which the call reads"):
        pycudnn.convolution(X, W, out=overlapping, **FLAGS)
    assert engine.launches == []


@pytest.mark.parametrize("shape", [(2, 4, 8, 8), [2, 4, 8, 8]])
def test_backward_data_is_remembered_for_a_tuple_or_list_shape(engine, shape):
    gy, dx = T(0x40000000, 2, 6, 6, 6), T(0x50000000, 2, 4, 8, 8)
    for _ in range(2):
        assert pycudnn.convolution_backward_data(gy, W, shape, out=dx, **FLAGS) is dx
    assert engine.runs == ["backward_data"]
    assert engine.launches == [(dx.ptr, W.ptr, gy.ptr)]  # the forward roles: x, w, y


def test_backward_filter_and_add_relu_take_the_same_path(engine):
    gy, dw = T(0x40000000, 2, 6, 6, 6), T(0x50000000, 6, 4, 3, 3)
    z, y, b = T(0x60000000, 2, 6, 6, 6), T(0x70000000, 2, 6, 6, 6), T(0x7A000000, 6)
    for _ in range(2):
        pycudnn.convolution_backward_filter(X, gy, W.shape, out=dw, **FLAGS)
        pycudnn.convolution_add_relu(X, W, z, bias=b, out=y, **FLAGS)
    assert engine.runs == ["backward_filter", "forward"]
    assert engine.launches == [(X.ptr, dw.ptr, gy.ptr), (X.ptr, W.ptr, y.ptr, z.ptr, b.ptr)]
