"""Activation, softmax and pooling on a GPU against float64 NumPy references written here: every
mode x dtype x layout (NCHW, channels-last, a non-dense strided view) x 2-D/3-D pooling, forward
and backward; the backward functions against central finite differences of the forward
references in float64; in-place activation; nothing written outside ``out``; refused calls leave
buffers untouched; repeated calls; streams. Also runs the CPU module (validation and fuzz on
made-up addresses) in a subprocess that sees no GPU."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

import pycudnn
from pycudnn.runtime.memory import synchronize
from pycudnn.ops.activation import activation_backward, activation_forward
from pycudnn.ops.pooling import pooling_backward, pooling_forward
from pycudnn.ops.softmax import softmax_backward, softmax_forward

pytestmark = pytest.mark.gpu

DTYPES = ["float32", "float16", "bfloat16", "float64"]
LAYOUTS = ["nchw", "nhwc", "strided"]
TOL = {"float64": 1e-10, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


# ---- host data and device views -------------------------------------------------------------------

def np_dtype(name):
    return pycudnn.tensor_from_pointer(0, (0,), name).dtype


def rounded(a, dtype):
    """``a`` rounded to ``dtype`` and back to float64 (what the device holds)."""
    return np.asarray(a, np.float64).astype(np_dtype(dtype)).astype(np.float64)


def device(a, dtype, layout):
    """A device view of ``a`` (float64 host data) in ``layout``: dense NCHW, channels-last, or a
    non-dense view (every dim's stride doubled: gaps between all elements)."""
    a = np.asarray(a).astype(np_dtype(dtype))
    if layout == "nhwc" and a.ndim in (4, 5):
        return pycudnn.from_numpy(a, memory_format="channels_last")
    if layout == "strided":
        big = np.zeros(tuple(2 * n for n in a.shape), a.dtype)
        big[tuple(slice(None, None, 2) for _ in a.shape)] = a
        buf = pycudnn.from_numpy(big)
        return pycudnn.tensor_from_pointer(buf.ptr, a.shape, a.dtype,
                                           strides=tuple(2 * s for s in buf.strides),
                                           device=buf.device, owner=buf)
    return pycudnn.from_numpy(a)


def host(t):
    return t.numpy().astype(np.float64)


def close(actual, expected, dtype, what=""):
    expected = np.asarray(expected, np.float64)
    scale = max(float(np.abs(expected).max()) if expected.size else 0.0, 1.0)
    err = float(np.abs(np.asarray(actual, np.float64) - expected).max()) / scale if expected.size else 0.0
    assert err <= TOL[dtype], f"{what}: relative error {err:.2e} > {TOL[dtype]:.0e}"


# ---- float64 references ----------------------------------------------------------------------------

def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def act_ref(x, mode, coef):
    if mode == "relu":
        return np.maximum(x, 0.0)
    if mode == "sigmoid":
        return sigmoid(x)
    if mode == "tanh":
        return np.tanh(x)
    if mode == "clipped_relu":
        return np.minimum(np.maximum(x, 0.0), coef)
    if mode == "elu":
        return np.where(x > 0, x, coef * np.expm1(x))
    if mode == "swish":
        return x * sigmoid(coef * x)
    raise AssertionError(mode)


def act_grad_ref(x, dy, mode, coef):
    """d activation / dx * dy, derived by hand (the finite-difference test checks these too)."""
    if mode == "relu":
        d = (x > 0).astype(np.float64)
    elif mode == "sigmoid":
        s = sigmoid(x)
        d = s * (1 - s)
    elif mode == "tanh":
        d = 1 - np.tanh(x) ** 2
    elif mode == "clipped_relu":
        d = ((x > 0) & (x < coef)).astype(np.float64)
    elif mode == "elu":
        d = np.where(x > 0, 1.0, coef * np.exp(x))
    elif mode == "swish":
        s = sigmoid(coef * x)
        d = s + coef * x * s * (1 - s)
    else:
        raise AssertionError(mode)
    return d * dy


def softmax_axes(ndim, mode):
    return (1,) if mode == "channel" else tuple(range(1, ndim))


def softmax_ref(x, algorithm, mode):
    axes = softmax_axes(x.ndim, mode)
    z = x - x.max(axis=axes, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=axes, keepdims=True)
    return z - np.log(s) if algorithm == "log" else e / s


def softmax_grad_ref(y, dy, algorithm, mode):
    axes = softmax_axes(y.ndim, mode)
    if algorithm == "log":
        return dy - np.exp(y) * dy.sum(axis=axes, keepdims=True)
    return y * (dy - (dy * y).sum(axis=axes, keepdims=True))


def pool_windows(shape, k, s, p):
    """For each output position (tuple), the input positions of its window that are inside x."""
    out = [(i + 2 * pi - ki) // si + 1 for i, ki, si, pi in zip(shape, k, s, p)]
    for o in itertools.product(*map(range, out)):
        ranges = [range(oi * si - pi, oi * si - pi + ki) for oi, si, pi, ki in zip(o, s, p, k)]
        inside = [tuple(r) for r in itertools.product(*ranges)
                  if all(0 <= ri < n for ri, n in zip(r, shape))]
        yield o, inside


def pool_ref(x, k, s, p, mode):
    n, c = x.shape[:2]
    out_sp = [(i + 2 * pi - ki) // si + 1 for i, ki, si, pi in zip(x.shape[2:], k, s, p)]
    y = np.zeros((n, c, *out_sp))
    for o, inside in pool_windows(x.shape[2:], k, s, p):
        vals = np.stack([x[(slice(None), slice(None)) + q] for q in inside], axis=-1)
        if mode.startswith("max"):
            y[(slice(None), slice(None)) + o] = vals.max(axis=-1)
        elif mode == "average_include_padding":
            y[(slice(None), slice(None)) + o] = vals.sum(axis=-1) / np.prod(k)
        else:
            y[(slice(None), slice(None)) + o] = vals.sum(axis=-1) / len(inside)
    return y


def pool_grad_ref(x, dy, k, s, p, mode):
    dx = np.zeros_like(x, dtype=np.float64)
    for o, inside in pool_windows(x.shape[2:], k, s, p):
        g = dy[(slice(None), slice(None)) + o]
        if mode.startswith("max"):
            vals = np.stack([x[(slice(None), slice(None)) + q] for q in inside], axis=-1)
            arg = vals.argmax(axis=-1)
            for j, q in enumerate(inside):
                dx[(slice(None), slice(None)) + q] += np.where(arg == j, g, 0.0)
        else:
            div = np.prod(k) if mode == "average_include_padding" else len(inside)
            for q in inside:
                dx[(slice(None), slice(None)) + q] += g / div
    return dx


def distinct(shape, seed):
    """Values with no ties anywhere (so max pooling has one maximum per window in every dtype):
    +-m * 2**(e - 8), m in [128, 256), exact in bfloat16 and float16 (sizes up to 2048)."""
    n = int(np.prod(shape))
    assert n <= 2048
    rng = np.random.default_rng(seed)
    i = rng.permutation(n)
    v = (128 + i % 128) * 2.0 ** (i // 128 - 8)
    return (v * rng.choice([-1.0, 1.0], n)).reshape(shape) / 64


def spaced(shape, seed):
    """A random permutation of evenly spaced values 1/8 apart (exact in float64), centred on 0:
    for finite differences of max pooling, whose step must stay far below the gap between any
    two values, or a perturbed element overtakes its neighbour and the difference quotient
    straddles a kink of max (``distinct``'s values are only 2**-14 apart near 0)."""
    n = int(np.prod(shape))
    return (np.random.default_rng(seed).permutation(n) - n // 2).reshape(shape) / 8.0


# ---- activation --------------------------------------------------------------------------------------

ACT = [("relu", 0.0), ("sigmoid", 0.0), ("tanh", 0.0), ("clipped_relu", 1.5), ("elu", 1.0),
       ("elu", 0.5), ("swish", 1.0), ("swish", 2.0)]


@pytest.mark.parametrize("mode,coef", ACT, ids=[f"{m}-{c}" for m, c in ACT])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_activation_forward_and_backward(mode, coef, dtype, layout):
    rng = np.random.default_rng(0)
    shape = (2, 5, 6, 7)
    x = rounded(rng.uniform(-3, 3, shape), dtype)
    x[np.abs(x) < 2e-2] = 0.5  # away from the kinks of relu and clipped_relu
    x[np.abs(x - 1.5) < 2e-2] = 0.7
    dy = rounded(rng.standard_normal(shape), dtype)
    X = device(x, dtype, layout)
    Y = activation_forward(X, mode, coef=coef)
    assert Y.shape == shape and Y.dtype == X.dtype
    if layout == "nhwc":
        assert Y.memory_format == "channels_last"
    y = host(Y)
    close(y, act_ref(x, mode, coef), dtype, "forward")
    DX = activation_backward(Y, device(dy, dtype, layout), X, mode, coef=coef)
    close(host(DX), act_grad_ref(x, dy, mode, coef), dtype, "backward")


@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (2, 3, 4), (2, 3, 2, 3, 4)])
def test_activation_of_other_ranks(shape):
    x = np.random.default_rng(1).standard_normal(shape)
    y = host(activation_forward(pycudnn.from_numpy(x), "tanh"))
    close(y, np.tanh(x), "float64", str(shape))


def test_activation_in_place_and_into_strided_out():
    x = np.random.default_rng(2).standard_normal((2, 3, 4, 5)).astype(np.float32)
    X = pycudnn.from_numpy(x)
    assert activation_forward(X, "relu", out=X) is X
    close(host(X), np.maximum(x, 0), "float32", "in place")
    big = pycudnn.from_numpy(np.full((2, 3, 4, 10), np.nan, np.float32))
    out = pycudnn.tensor_from_pointer(big.ptr, (2, 3, 4, 5), "float32", strides=(120, 40, 10, 2),
                                      owner=big)
    assert activation_forward(pycudnn.from_numpy(x), "sigmoid", out=out) is out
    b = big.numpy()
    close(b[..., ::2], sigmoid(x.astype(np.float64)), "float32", "strided out")
    assert np.isnan(b[..., 1::2]).all()  # nothing written between out's elements


def test_nan_propagates_like_pytorch():
    x = np.array([[[[np.nan, 1.0], [-1.0, 2.0]]]], np.float32)
    y = host(activation_forward(pycudnn.from_numpy(x), "relu"))
    assert np.isnan(y[0, 0, 0, 0]) and y[0, 0, 0, 1] == 1.0 and y[0, 0, 1, 0] == 0.0
    p = host(pooling_forward(pycudnn.from_numpy(x), 2))
    assert np.isnan(p[0, 0, 0, 0])


# ---- softmax ---------------------------------------------------------------------------------------------

SOFTMAX = list(itertools.product(["accurate", "fast", "log"], ["channel", "instance"]))


@pytest.mark.parametrize("algorithm,mode", SOFTMAX, ids=[f"{a}-{m}" for a, m in SOFTMAX])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(3, 7, 4, 5), (2, 5, 2, 3, 4), (6, 10)], ids=["4d", "5d", "2d"])
def test_softmax_forward_and_backward(algorithm, mode, dtype, layout, shape):
    rng = np.random.default_rng(3)
    x = rounded(rng.uniform(-4, 4, shape), dtype)
    y_ref = softmax_ref(x, algorithm, mode)
    Y = softmax_forward(device(x, dtype, layout), algorithm=algorithm, mode=mode)
    close(host(Y), y_ref, dtype, "forward")
    dy = rounded(rng.standard_normal(shape), dtype)
    y_in = rounded(y_ref, dtype)  # the gradient is taken at the y the device holds
    DX = softmax_backward(device(y_in, dtype, layout), device(dy, dtype, layout),
                          algorithm=algorithm, mode=mode)
    close(host(DX), softmax_grad_ref(y_in, dy, algorithm, mode), dtype, "backward")


# ---- pooling ---------------------------------------------------------------------------------------------

POOL_MODES = ["max", "max_deterministic", "average_include_padding", "average_exclude_padding"]
GEOMETRIES = [
    ((2, 3, 9, 9), (3, 3), (2, 2), (1, 1)),      # ResNet's stem pool, small
    ((2, 3, 8, 7), (2, 3), (2, 1), (1, 1)),
    ((2, 2, 7, 7), (7, 7), (7, 7), (0, 0)),      # global average
    ((2, 2, 5, 6, 7), (3, 2, 3), (2, 2, 1), (1, 1, 0)),  # 3-D
]
GEO_IDS = ["3x3s2p1", "2x3s21p1", "global", "3d"]


@pytest.mark.parametrize("mode", POOL_MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=GEO_IDS)
def test_pooling_forward_and_backward(mode, dtype, layout, geometry):
    shape, k, s, p = geometry
    x = distinct(shape, 4)
    y_ref = pool_ref(x, k, s, p, mode)
    X = device(x, dtype, layout)
    Y = pooling_forward(X, k, stride=s, padding=p, mode=mode)
    assert Y.shape == y_ref.shape
    if layout == "nhwc":
        assert Y.memory_format == "channels_last"
    close(host(Y), y_ref, dtype, "forward")
    dy = rounded(np.random.default_rng(5).standard_normal(y_ref.shape), dtype)
    DX = pooling_backward(Y, device(dy, dtype, layout), X, k, stride=s, padding=p, mode=mode)
    close(host(DX), pool_grad_ref(x, dy, k, s, p, mode), dtype, "backward")


def test_max_deterministic_backward_gives_the_same_bits():
    x = distinct((2, 4, 9, 9), 6)
    X = pycudnn.from_numpy(x.astype(np.float32))
    Y = pooling_forward(X, 3, stride=1, padding=1, mode="max_deterministic")
    dy = pycudnn.from_numpy(np.random.default_rng(7).standard_normal(Y.shape).astype(np.float32))
    a = pooling_backward(Y, dy, X, 3, stride=1, padding=1, mode="max_deterministic").numpy()
    b = pooling_backward(Y, dy, X, 3, stride=1, padding=1, mode="max_deterministic").numpy()
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


# ---- gradients against central finite differences (float64) ---------------------------------------------

def numeric_grad(f, x, dy, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = ((f(xp) - f(xm)) * dy).sum() / (2 * eps)
    return g


@pytest.mark.parametrize("mode,coef", ACT, ids=[f"{m}-{c}" for m, c in ACT])
def test_activation_backward_is_the_derivative(mode, coef):
    rng = np.random.default_rng(8)
    x = rng.uniform(-2, 2, (1, 2, 3, 3))
    x[np.abs(x) < 0.05] = 0.3
    if mode == "clipped_relu":
        x[np.abs(x - coef) < 0.05] = 0.7
    dy = rng.standard_normal(x.shape)
    X = pycudnn.from_numpy(x)
    Y = activation_forward(X, mode, coef=coef)
    got = host(activation_backward(Y, pycudnn.from_numpy(dy), X, mode, coef=coef))
    want = numeric_grad(lambda v: host(activation_forward(pycudnn.from_numpy(v), mode, coef=coef)),
                        x, dy)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("algorithm,mode", SOFTMAX, ids=[f"{a}-{m}" for a, m in SOFTMAX])
def test_softmax_backward_is_the_derivative(algorithm, mode):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 2, 2))
    dy = rng.standard_normal(x.shape)
    fwd = lambda v: host(softmax_forward(pycudnn.from_numpy(v), algorithm=algorithm, mode=mode))  # noqa: E731
    Y = softmax_forward(pycudnn.from_numpy(x), algorithm=algorithm, mode=mode)
    got = host(softmax_backward(Y, pycudnn.from_numpy(dy), algorithm=algorithm, mode=mode))
    np.testing.assert_allclose(got, numeric_grad(fwd, x, dy), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", POOL_MODES)
@pytest.mark.parametrize("geometry", [((1, 2, 5, 5), (3, 3), (2, 2), (1, 1)),
                                      ((1, 1, 4, 3, 4), (2, 2, 2), (1, 1, 2), (1, 0, 1))],
                         ids=["2d", "3d"])
def test_pooling_backward_is_the_derivative(mode, geometry):
    shape, k, s, p = geometry
    x = spaced(shape, 10)  # gaps of 1/8 >> 2 * eps: no window's maximum changes under +-eps
    dy = np.random.default_rng(11).standard_normal(pool_ref(x, k, s, p, mode).shape)
    X = pycudnn.from_numpy(x)
    Y = pooling_forward(X, k, stride=s, padding=p, mode=mode)
    got = host(pooling_backward(Y, pycudnn.from_numpy(dy), X, k, stride=s, padding=p, mode=mode))
    fwd = lambda v: host(pooling_forward(pycudnn.from_numpy(v), k, stride=s, padding=p, mode=mode))  # noqa: E731
    np.testing.assert_allclose(got, numeric_grad(fwd, x, dy, eps=1e-4), rtol=1e-6, atol=1e-7)


# ---- refused calls leave buffers untouched; repeated calls; streams; interop ----------------------------

def test_refused_calls_leave_every_buffer_untouched():
    x = np.random.default_rng(12).standard_normal((2, 3, 8, 8)).astype(np.float32)
    X = pycudnn.from_numpy(x)
    out = pycudnn.from_numpy(np.full((2, 3, 8, 8), 7.0, np.float32))
    half = pycudnn.tensor_from_pointer(X.ptr + 4 * 64, (2, 3, 8, 8), "float32", strides=X.strides,
                                       owner=X)  # partly overlaps X (stays inside X's rows)
    for call in [lambda: activation_forward(X, "softplus", out=out),
                 lambda: activation_forward(X, out=half),
                 lambda: softmax_forward(X, out=X),
                 lambda: pooling_forward(X, 3, padding=2, out=out),
                 lambda: pooling_backward(out, out, X, 2),
                 lambda: activation_backward(X, out, X, out=out)]:
        with pytest.raises((ValueError, TypeError)):
            call()
    synchronize()
    assert np.array_equal(X.numpy(), x)
    assert (out.numpy() == 7.0).all()


def test_repeated_calls_reuse_descriptors_and_stay_right():
    from pycudnn.cudnn.descriptors import live_descriptor_count

    x = np.random.default_rng(13).standard_normal((4, 8, 6, 6)).astype(np.float32)
    X = pycudnn.from_numpy(x)
    pooling_forward(X, 2)
    before = live_descriptor_count()
    for _ in range(20):
        y = pooling_forward(X, 2)
    assert live_descriptor_count() == before
    close(host(y), pool_ref(x.astype(np.float64), (2, 2), (2, 2), (0, 0), "max"), "float32")


def test_runs_on_the_given_stream():
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.randn(8, 16, 32, 32, device="cuda")
        y = pycudnn.as_tensor(torch.empty_like(x))
        for _ in range(5):  # queued on s, after x's initialisation on s
            activation_forward(x, "sigmoid", out=y, stream=s)
        got = torch.from_dlpack(y)  # same memory
        s.synchronize()
    torch.testing.assert_close(got, torch.sigmoid(x))


def test_torch_tensors_in_and_agreement_with_pytorch():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    x = torch.randn(4, 8, 14, 14, device="cuda", dtype=torch.float64).contiguous(
        memory_format=torch.channels_last)
    with torch.backends.cudnn.flags(enabled=False):
        cases = [(pooling_forward(x, 3, stride=2, padding=1), F.max_pool2d(x, 3, 2, 1)),
                 (pooling_forward(x, 2, mode="average_include_padding"), F.avg_pool2d(x, 2)),
                 (softmax_forward(x), F.softmax(x, dim=1)),
                 (softmax_forward(x, algorithm="log"), F.log_softmax(x, dim=1)),
                 (activation_forward(x, "swish", coef=1.0), F.silu(x)),
                 (activation_forward(x, "elu", coef=1.0), F.elu(x)),
                 (activation_forward(x, "clipped_relu", coef=6.0), F.relu6(x))]
        for got, want in cases:
            torch.testing.assert_close(torch.from_dlpack(got), want, rtol=1e-10, atol=1e-10)


def test_cpu_module_without_gpu(tmp_path):
    """test_ops_activation_softmax_pooling.py builds views of made-up addresses: on a GPU machine
    it runs where no GPU is visible, against this machine's libcudnn."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join("tests", "test_ops_activation_softmax_pooling.py")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout, proc.stdout[-2000:]
