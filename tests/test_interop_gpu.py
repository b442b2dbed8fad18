"""Work lands on the stream pycudnn.current_stream() names (PyTorch, CuPy, Numba side streams).

The check is capture-based: the convolution is warmed up, then called while the framework's
side stream is being captured into a CUDA graph. Work that went to that stream shows up as graph
nodes; work that went anywhere else runs eagerly and leaves the graph empty (the negative
control passes stream=0 during the same kind of capture).
"""

from __future__ import annotations

import numpy as np
import pytest

import pycudnn
from pycudnn.runtime import memory as M

pytestmark = pytest.mark.gpu


def captured_nodes(stream: int, fn) -> int:
    """Run fn while ``stream`` is captured; the number of nodes the capture recorded."""
    from cuda.bindings import runtime as rt

    mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed
    err, = rt.cudaStreamBeginCapture(stream, mode)
    assert int(err) == 0, err
    try:
        fn()
    finally:
        err, graph = rt.cudaStreamEndCapture(stream)
    assert int(err) == 0, err
    try:
        err, _nodes, n = rt.cudaGraphGetNodes(graph)
        assert int(err) == 0, err
    finally:
        rt.cudaGraphDestroy(graph)
    return int(n)


def _conv_args(rng):
    x = rng.standard_normal((4, 8, 16, 16)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    return x, w


def _check_lands_on(stream: int, x, w, y, non_blocking: bool) -> None:
    kw = dict(padding=1, allow_tf32=False, out=y)
    pycudnn.convolution(x, w, stream=stream, **kw)  # warm up: search and cache
    M.stream_synchronize(stream)
    assert captured_nodes(stream, lambda: pycudnn.convolution(x, w, stream=stream, **kw)) > 0
    if non_blocking:
        # negative control: work on the legacy default stream is not recorded. (Only for a
        # non-blocking stream: the legacy stream would wait on a blocking one, which a capture
        # forbids.) pycudnn tensors here: a CuPy array names its producer stream, which the
        # legacy stream would wait on -- a dependency on the capturing stream, also forbidden.
        xt, wt, yt = (pycudnn.as_tensor(a, stream=stream) for a in (x, w, y))
        kw["out"] = yt
        pycudnn.convolution(xt, wt, stream=0, **kw)
        M.synchronize()
        assert captured_nodes(stream, lambda: pycudnn.convolution(xt, wt, stream=0, **kw)) == 0
    M.synchronize()


def test_torch_side_stream():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x_h, w_h = _conv_args(np.random.default_rng(0))
    x, w = torch.from_numpy(x_h).cuda(), torch.from_numpy(w_h).cuda()
    y = torch.empty((4, 16, 16, 16), device="cuda")
    assert pycudnn.current_stream("torch") == torch.cuda.current_stream().cuda_stream
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        s = pycudnn.current_stream("torch")
        assert s == side.cuda_stream != 0
        assert pycudnn.current_stream(x) == s
        _check_lands_on(s, x, w, y, non_blocking=True)  # torch streams are non-blocking
    torch.cuda.synchronize()
    expected = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    assert float((y.double() - expected).abs().max()) < 1e-3


def test_cupy_side_stream():
    cupy = pytest.importorskip("cupy")
    x_h, w_h = _conv_args(np.random.default_rng(1))
    x, w = cupy.asarray(x_h), cupy.asarray(w_h)
    y = cupy.empty((4, 16, 16, 16), cupy.float32)
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        s = pycudnn.current_stream("cupy")
        assert s == side.ptr != 0
        assert pycudnn.current_stream(x) == s
        _check_lands_on(s, x, w, y, non_blocking=True)
    side.synchronize()
    assert pycudnn.current_stream("cupy") == cupy.cuda.get_current_stream().ptr


def test_numba_array_stream():
    numba_cuda = pytest.importorskip("numba.cuda")
    if not numba_cuda.is_available():
        pytest.skip("numba without CUDA")
    x_h, w_h = _conv_args(np.random.default_rng(2))
    stream = numba_cuda.stream()
    x = numba_cuda.to_device(x_h, stream=stream)
    w = numba_cuda.to_device(w_h, stream=stream)
    y = numba_cuda.device_array((4, 16, 16, 16), np.float32, stream=stream)
    s = pycudnn.current_stream(x)
    assert s != 0 and pycudnn.current_stream(stream) == s
    assert pycudnn.current_stream("numba") in (0, 1, 2)  # Numba's default stream
    _check_lands_on(s, x, w, y, non_blocking=False)  # numba.cuda.stream() is a blocking stream
    stream.synchronize()


def test_cuda_core_stream_object():
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    s = pycudnn.current_stream(stream)
    assert s == int(stream.handle) != 0
    rng = np.random.default_rng(3)
    x_h, w_h = _conv_args(rng)
    x, w = pycudnn.from_numpy(x_h), pycudnn.from_numpy(w_h)
    y = pycudnn.empty((4, 16, 16, 16), "float32")
    _check_lands_on(s, x, w, y, non_blocking=False)
    stream.sync()
