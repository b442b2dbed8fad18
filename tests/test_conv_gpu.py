"""GPU correctness matrix of every convolution direction against float64 NumPy references.

Dims 1-3, stride 1-2, padding 0-2, dilation 1-2, groups 1, 2, 4 and depthwise, every dtype,
NCHW and NHWC, batch 0 and 1, benchmark on and off, and every engine.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

import reference as R

pytestmark = pytest.mark.gpu

DTYPES = {
    # name: (pycudnn dtype, allow_tf32, tolerance relative to the output's scale)
    "float64": ("float64", True, 1e-10),
    "float32": ("float32", False, 2e-5),
    "tf32": ("float32", True, 5e-3),
    "float16": ("float16", True, 1e-2),
    "bfloat16": ("bfloat16", True, 6e-2),
}

# (dims, stride, padding, dilation, groups, in_channels, out_channels)
GEOMETRIES = [
    (1, 1, 0, 1, 1, 4, 8),
    (1, 2, 2, 2, 2, 4, 6),
    (2, 1, 1, 1, 1, 4, 8),
    (2, 2, 0, 2, 2, 4, 8),
    (2, 1, 2, 1, 4, 8, 8),
    (2, 2, 1, 1, 8, 8, 8),     # depthwise
    (3, 1, 1, 1, 1, 4, 4),
    (3, 2, 0, 2, 2, 4, 4),
]


def engines():
    return ["v7", "graph"]


def _round(a, dtype):
    """The host data as the GPU will see it (rounded to dtype), in float64."""
    import pycudnn._types as T

    return np.asarray(a, dtype=T.normalize_dtype(dtype)).astype(np.float64)


def _dev(a, dtype, fmt):
    import pycudnn

    return pycudnn.from_numpy(np.asarray(a, np.float32) if dtype != "float64" else a,
                              dtype=dtype, memory_format=fmt)


def _host(t):
    return np.asarray(t.numpy(), dtype=np.float64)


def _close(got, ref, tol, what):
    scale = max(float(np.abs(ref).max()), 1e-6) if ref.size else 1.0
    err = float(np.abs(got - ref).max()) / scale if ref.size else 0.0
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    assert err <= tol, f"{what}: max error {err:.3g} of scale {scale:.3g} > {tol}"


def _cases():
    for engine, (dname, (dtype, tf32, tol)), geo in itertools.product(engines(), DTYPES.items(), GEOMETRIES):
        dims = geo[0]
        fmts = ["contiguous"] + (["channels_last"] if dims >= 2 else [])
        for fmt in fmts:
            yield pytest.param(engine, dname, geo, fmt, id=f"{engine}-{dname}-{dims}d-s{geo[1]}p{geo[2]}d{geo[3]}g{geo[4]}-{fmt}")


def _setup(dname, geo, fmt, batch=2, seed=0):
    dtype, tf32, tol = DTYPES[dname]
    dims, s, p, d, g, c, k = geo
    rng = np.random.default_rng(seed)
    size = {1: 11, 2: 7, 3: 5}[dims]
    ksize = 3 if dims < 3 else 2
    x = _round(rng.standard_normal((batch, c) + (size,) * dims), dtype)
    w = _round(rng.standard_normal((k, c // g) + (ksize,) * dims), dtype)
    geom = dict(stride=(s,) * dims, padding=(p,) * dims, dilation=(d,) * dims, groups=g)
    return dtype, tf32, tol, x, w, geom, rng


@pytest.mark.parametrize("engine,dname,geo,fmt", list(_cases()))
def test_all_directions(engine, dname, geo, fmt):
    import pycudnn

    dtype, tf32, tol, x, w, geom, rng = _setup(dname, geo, fmt)
    # half the cells measure, half use heuristics (a stable choice, unlike hash())
    measure = zlib.crc32(repr((dname, geo, fmt)).encode()) % 2 == 0
    flags = dict(engine=engine, allow_tf32=tf32, benchmark=measure)
    X, W = _dev(x, dtype, fmt), _dev(w, dtype, fmt)

    ref = R.conv_forward(x, w, **geom)
    y = pycudnn.convolution(X, W, **geom, **flags)
    assert y.dtype.name == dtype
    # channels_last in, channels_last out; float64 runs in NCHW (cuDNN has no NHWC double kernels)
    expect_fmt = "channels_last" if fmt == "channels_last" and dtype != "float64" else "contiguous"
    assert y.memory_format == expect_fmt
    _close(_host(y), ref, tol, "forward")

    bias = _round(rng.standard_normal(w.shape[0]), dtype)
    yb = pycudnn.convolution(X, W, _dev(bias, dtype, "contiguous"), **geom, **flags)
    _close(_host(yb), ref + bias.reshape((1, -1) + (1,) * (x.ndim - 2)), tol, "forward+bias")

    dy = _round(rng.standard_normal(ref.shape), dtype)
    DY = _dev(dy, dtype, fmt)
    dx = pycudnn.convolution_backward_data(DY, W, x.shape, **geom, **flags)
    _close(_host(dx), R.conv_backward_data(dy, w, x.shape, **geom), tol, "backward_data")

    dw = pycudnn.convolution_backward_filter(X, DY, w.shape, **geom, **flags)
    _close(_host(dw), R.conv_backward_filter(x, dy, w.shape, **geom), tol * 2, "backward_filter")

    z = _round(rng.standard_normal(ref.shape), dtype)
    alpha = 0.5
    fused = pycudnn.convolution_add_relu(X, W, _dev(z, dtype, fmt), alpha=alpha,
                                         bias=_dev(bias, dtype, "contiguous"), **geom, **flags)
    expect = np.maximum(ref + alpha * z + bias.reshape((1, -1) + (1,) * (x.ndim - 2)), 0)
    _close(_host(fused), expect, tol * 2, "add_relu")


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("dname", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_conv_transpose(engine, dname, dims):
    import pycudnn

    dtype, tf32, tol = DTYPES[dname]
    rng = np.random.default_rng(1)
    x = _round(rng.standard_normal((2, 4) + (5,) * dims), dtype)
    w = _round(rng.standard_normal((4, 3) + (3,) * dims), dtype)  # (C_in, C_out/groups, k)
    b = _round(rng.standard_normal(6), dtype)
    geom = dict(stride=2, padding=1, output_padding=1, dilation=1, groups=2)
    y = pycudnn.conv_transpose(_dev(x, dtype, "contiguous"), _dev(w, dtype, "contiguous"),
                               _dev(b, dtype, "contiguous"), engine=engine, allow_tf32=tf32, **geom)
    t = lambda v: (v,) * dims  # noqa: E731
    ref = R.conv_transpose(x, w, t(2), t(1), t(1), t(1), 2) + b.reshape((1, -1) + (1,) * dims)
    assert y.shape == ref.shape
    _close(_host(y), ref, tol, "conv_transpose")


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("measure", [False, True])  # not "benchmark": pytest-benchmark owns that name
def test_batch_zero_and_one(engine, measure):
    import pycudnn

    rng = np.random.default_rng(2)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    W = pycudnn.from_numpy(w)
    x0 = pycudnn.from_numpy(np.zeros((0, 4, 8, 8), np.float32))
    y0 = pycudnn.convolution(x0, W, padding=1, engine=engine, benchmark=measure)
    assert y0.shape == (0, 8, 8, 8)
    dw0 = pycudnn.convolution_backward_filter(x0, pycudnn.from_numpy(np.zeros((0, 8, 8, 8), np.float32)),
                                              (8, 4, 3, 3), padding=1, engine=engine)
    assert np.all(dw0.numpy() == 0)  # an empty batch contributes a zero gradient
    x1 = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    y1 = pycudnn.convolution(pycudnn.from_numpy(x1), W, padding=1, engine=engine,
                             benchmark=measure, allow_tf32=False)
    _close(_host(y1), R.conv_forward(x1, w, (1, 1), (1, 1), (1, 1), 1), 2e-5, "batch 1")


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("dname", ["float32", "float16", "bfloat16"])
def test_deterministic_is_bitwise_repeatable(engine, dname):
    import pycudnn

    dtype = DTYPES[dname][0]
    rng = np.random.default_rng(3)
    x = _dev(rng.standard_normal((4, 16, 12, 12)), dtype, "channels_last")
    w = _dev(rng.standard_normal((16, 16, 3, 3)), dtype, "channels_last")
    dy = _dev(rng.standard_normal((4, 16, 12, 12)), dtype, "channels_last")
    for measure in (False, True):
        kw = dict(padding=1, engine=engine, deterministic=True, benchmark=measure)
        a = [pycudnn.convolution_backward_filter(x, dy, (16, 16, 3, 3), **kw).numpy() for _ in range(3)]
        b = [pycudnn.convolution_backward_data(dy, w, (4, 16, 12, 12), **kw).numpy() for _ in range(3)]
        for arr in (a, b):
            assert all(np.array_equal(arr[0].view(np.uint8), v.view(np.uint8)) for v in arr[1:])


@pytest.mark.parametrize("engine", engines())
def test_out_argument_and_noncontiguous_out(engine):
    import pycudnn

    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    ref = R.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1)
    out = pycudnn.empty((2, 5, 6, 6), "float32", memory_format="channels_last")
    y = pycudnn.convolution(pycudnn.from_numpy(x), pycudnn.from_numpy(w), padding=1, out=out,
                            engine=engine, allow_tf32=False)
    assert y is out or y.ptr == out.ptr
    _close(_host(out), ref, 2e-5, "out (channels_last for a contiguous input)")


@pytest.mark.parametrize("engine", engines())
def test_interleaved_out_next_to_its_input_runs(engine):
    """Odd channels of one buffer read, even channels written: no element shared, so the call is
    accepted and the input's channels stay as they were (twin of a CPU validation test)."""
    import pycudnn

    rng = np.random.default_rng(11)
    buf = rng.standard_normal((2, 8, 8, 8)).astype(np.float32)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    B = pycudnn.from_numpy(buf)
    strides = (512, 128, 8, 1)  # every other channel of the (2, 8, 8, 8) buffer
    x = pycudnn.tensor_from_pointer(B.ptr + 4 * 64, (2, 4, 8, 8), "float32", strides=strides)
    out = pycudnn.tensor_from_pointer(B.ptr, (2, 4, 8, 8), "float32", strides=strides)
    pycudnn.convolution(x, pycudnn.from_numpy(w), padding=1, out=out, engine=engine, allow_tf32=False)
    got = _host(B)
    ref = R.conv_forward(buf[:, 1::2].astype(np.float64), w.astype(np.float64), (1, 1), (1, 1), (1, 1), 1)
    _close(got[:, 0::2], ref, 5e-5, "interleaved out")
    assert np.array_equal(got[:, 1::2], buf[:, 1::2])


@pytest.mark.parametrize("engine", engines())
def test_add_relu_in_place_residual(engine):
    import pycudnn

    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 8, 6, 6)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    z = rng.standard_normal((2, 8, 6, 6)).astype(np.float32)
    ref = np.maximum(R.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1) + z, 0)
    for measure in (True, False):
        Z = pycudnn.from_numpy(z)
        y = pycudnn.convolution_add_relu(pycudnn.from_numpy(x), pycudnn.from_numpy(w), Z, padding=1,
                                         out=Z, engine=engine, allow_tf32=False, benchmark=measure)
        assert y.ptr == Z.ptr
        _close(_host(Z), ref, 5e-5, f"in-place residual benchmark={measure}")
