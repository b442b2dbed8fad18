"""Repeated convolutions replayed from CUDA graphs (pycudnn.runtime.memory.replay), on a GPU:
every direction and epilogue right against float64 on every call, new input data seen through
the same pointers, the same bits as a plain launch, a caller's own capture of a call that has a
graph, and the switch that turns replay off."""

from __future__ import annotations

import numpy as np
import pytest

import reference as R

pytestmark = pytest.mark.gpu

import pycudnn
from pycudnn.runtime.memory import copy_device_to_host, copy_host_to_device
from pycudnn.runtime.memory import replay

CALLS = 6  # the third call with the same pointers is the first replayed
GEOMETRY = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
TOL = {"float32": 2e-5, "bfloat16": 2e-2}


@pytest.fixture(autouse=True)
def _replay_on():
    pycudnn.clear_caches()
    before = replay.settings()
    replay.configure(enabled=True, after=2)
    yield
    replay.configure(**before)
    pycudnn.clear_caches()


def _host(t):
    return t.numpy().astype(np.float64)


def _close(got, ref, dtype, what):
    err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1.0))
    assert err <= TOL[dtype], f"{what}: relative error {err:.2e}"


def _rounded(a, dtype):
    return pycudnn.from_numpy(a, dtype=dtype).numpy().astype(np.float64)


def _refill(t, values, dtype, fmt):
    """New data in ``t``'s own memory (same pointer), as ``values`` rounded to ``dtype``."""
    fresh = pycudnn.from_numpy(values, dtype=dtype, memory_format=fmt)
    raw = np.empty(t.nbytes, np.uint8)
    copy_device_to_host(raw, fresh.ptr)
    copy_host_to_device(t.ptr, raw)


CASES = [("float32", "contiguous"), ("bfloat16", "channels_last")]


@pytest.mark.parametrize("dtype,fmt", CASES)
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_a_repeated_call_is_replayed_and_right_on_every_call(dtype, fmt, direction):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 8, 9, 9)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 16, 9, 9)).astype(np.float32)
    X, W, DY = (pycudnn.from_numpy(a, dtype=dtype, memory_format=fmt) for a in (x, w, dy))
    xr, wr, dyr = (_rounded(a, dtype) for a in (x, w, dy))
    kw = dict(padding=1, allow_tf32=False)
    if direction == "forward":
        out = pycudnn.empty(dy.shape, dtype, memory_format=fmt)
        call = lambda: pycudnn.convolution(X, W, out=out, **kw)
        ref = lambda: R.conv_forward(xr, wr, **GEOMETRY)
    elif direction == "backward_data":
        out = pycudnn.empty(x.shape, dtype, memory_format=fmt)
        call = lambda: pycudnn.convolution_backward_data(DY, W, x.shape, out=out, **kw)
        ref = lambda: R.conv_backward_data(dyr, wr, x.shape, **GEOMETRY)
    else:
        out = pycudnn.empty(w.shape, dtype, memory_format=fmt)
        call = lambda: pycudnn.convolution_backward_filter(X, DY, w.shape, out=out, **kw)
        ref = lambda: R.conv_backward_filter(xr, dyr, w.shape, **GEOMETRY)
    built = replay.stats()["built"]
    for i in range(CALLS):
        _refill(out, np.full(out.shape, np.nan, np.float32), dtype, fmt)  # a stale result shows
        assert call().ptr == out.ptr
        _close(_host(out), ref(), dtype, f"call {i + 1}")
    assert replay.stats()["built"] == built + 1  # one graph, replayed from the third call on
    # new data through the same pointers: a replay reads the memory, not what it held then
    x2 = rng.standard_normal(x.shape).astype(np.float32)
    dy2 = rng.standard_normal(dy.shape).astype(np.float32)
    _refill(X, x2, dtype, fmt)
    _refill(DY, dy2, dtype, fmt)
    xr, dyr = _rounded(x2, dtype), _rounded(dy2, dtype)
    call()
    _close(_host(out), ref(), dtype, "new data in the same buffers")
    assert replay.stats()["built"] == built + 1


def test_fused_epilogues_replay_right():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 8, 9, 9)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    z = rng.standard_normal((2, 16, 9, 9)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    X, W, Z, B = (pycudnn.from_numpy(a) for a in (x, w, z, b))
    conv = R.conv_forward(x, w, **GEOMETRY)
    out = pycudnn.empty(z.shape, "float32")
    for i in range(CALLS):
        pycudnn.convolution_add_relu(X, W, Z, alpha=0.5, bias=B, padding=1, allow_tf32=False,
                                     out=out)
        want = np.maximum(conv + 0.5 * z + b[None, :, None, None], 0)
        _close(_host(out), want, "float32", f"add_relu call {i + 1}")
    for i in range(CALLS):
        pycudnn.convolution(X, W, B, padding=1, allow_tf32=False, out=out)
        _close(_host(out), conv + b[None, :, None, None], "float32", f"bias call {i + 1}")


def test_a_replay_gives_the_plain_launchs_bits():
    rng = np.random.default_rng(5)
    X = pycudnn.from_numpy(rng.standard_normal((4, 16, 12, 12)).astype(np.float32))
    W = pycudnn.from_numpy(rng.standard_normal((32, 16, 3, 3)).astype(np.float32))
    out = pycudnn.empty((4, 32, 12, 12), "float32")
    replay.configure(enabled=False)
    pycudnn.clear_caches()  # launchers made from now on launch plainly
    plain = pycudnn.convolution(X, W, padding=1, out=out, deterministic=True).numpy()
    built = replay.stats()["built"]
    for _ in range(CALLS):
        pycudnn.convolution(X, W, padding=1, out=out, deterministic=True)
    assert replay.stats()["built"] == built  # off: nothing captured
    replay.configure(enabled=True)
    pycudnn.clear_caches()
    for _ in range(CALLS):
        got = pycudnn.convolution(X, W, padding=1, out=out, deterministic=True).numpy()
        assert np.array_equal(got, plain)
    assert replay.stats()["built"] == built + 1


@pytest.mark.parametrize("shape", [(2, 8, 10, 10), (64, 64, 28, 28)], ids=["small", "workspace"])
def test_a_callers_capture_of_a_replayed_call_captures_a_plain_launch(shape):
    """The caller's own CUDA graph (thread-local or global mode) of a call that already has a
    replay graph: it captures cuDNN's launch (on a workspace of its own), replays right with new
    input data, and the call replays its graph again afterwards."""
    from cuda.bindings import runtime as rt

    err, stream = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)
    assert int(err) == 0
    s = int(stream)
    rng = np.random.default_rng(6)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((shape[1], shape[1], 3, 3)).astype(np.float32)
    X, W = pycudnn.from_numpy(x), pycudnn.from_numpy(w)
    Y = pycudnn.empty(shape, "float32")
    kw = dict(padding=1, allow_tf32=False, out=Y, stream=s)
    for _ in range(CALLS):
        pycudnn.convolution(X, W, **kw)
    rt.cudaStreamSynchronize(s)
    built = replay.stats()["built"]
    for mode in (rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal,
                 rt.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal):
        assert int(rt.cudaStreamBeginCapture(s, mode)[0]) == 0
        pycudnn.convolution(X, W, **kw)
        err, graph = rt.cudaStreamEndCapture(s)
        assert int(err) == 0
        err, gexec = rt.cudaGraphInstantiate(graph, 0)
        assert int(err) == 0
        x2 = rng.standard_normal(x.shape).astype(np.float32)
        _refill(X, x2, "float32", "contiguous")
        assert int(rt.cudaGraphLaunch(gexec, s)[0]) == 0
        rt.cudaStreamSynchronize(s)
        _close(_host(Y), R.conv_forward(x2, w, **GEOMETRY), "float32", "the caller's graph")
        rt.cudaGraphExecDestroy(gexec)
        rt.cudaGraphDestroy(graph)
    pycudnn.convolution(X, W, **kw)
    rt.cudaStreamSynchronize(s)
    _close(_host(Y), R.conv_forward(x2, w, **GEOMETRY), "float32", "replayed after the capture")
    assert replay.stats()["built"] == built
    rt.cudaStreamDestroy(stream)


def test_new_output_addresses_each_call_capture_nothing():
    rng = np.random.default_rng(7)
    X = pycudnn.from_numpy(rng.standard_normal((2, 8, 10, 10)).astype(np.float32))
    W = pycudnn.from_numpy(rng.standard_normal((8, 8, 3, 3)).astype(np.float32))
    built = replay.stats()["built"]
    keep = [pycudnn.convolution(X, W, padding=1) for _ in range(CALLS)]  # all alive: new addresses
    assert len({y.ptr for y in keep}) == CALLS
    assert replay.stats()["built"] == built
