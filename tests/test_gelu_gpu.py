"""GELU (erf and tanh forms) on a GPU, forward and backward, against float64 NumPy: every
layout (dense, channels-last, strided, a count with no flat block, 0-d, unaligned), the three
dtypes the graph API takes, in place, and a repeated call reusing its compiled plan."""

from __future__ import annotations

import math

import numpy as np
import pytest

import test_ops_gpu as R

pytestmark = pytest.mark.gpu

import pycudnn  # noqa: E402
from pycudnn.ops.activation import activation_backward, activation_forward  # noqa: E402

DTYPES = ["float32", "float16", "bfloat16"]
#: the compiled pointwise kernels' float32 erf/tanh are accurate to about 2e-5 relative
TOL = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1.6e-2}
_erf = np.vectorize(math.erf, otypes=[np.float64])
_K = math.sqrt(2.0 / math.pi)


def gelu_ref(mode, x):
    """(y, dy/dx) in float64."""
    if mode == "gelu":
        cdf = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
        pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return x * cdf, cdf + x * pdf
    u = _K * (x + 0.044715 * x ** 3)
    th = np.tanh(u)
    return 0.5 * x * (1.0 + th), 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * _K * (
        1.0 + 3 * 0.044715 * x * x)


def _check(got, want, dtype, what):
    err = np.abs(np.asarray(got, np.float64) - want) / np.maximum(np.abs(want), 1.0)
    assert err.max() <= TOL[dtype], f"{what}: relative error {err.max():.2e} > {TOL[dtype]:.0e}"


SHAPES = [((2, 64, 8, 8), "nchw"), ((2, 64, 8, 8), "nhwc"), ((2, 3, 5, 7), "strided"),
          ((7,), "nchw"), ((), "nchw"), ((3, 5, 2, 3, 4), "nchw")]


@pytest.mark.parametrize("mode", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,layout", SHAPES, ids=[f"{s}-{l}" for s, l in SHAPES])
def test_gelu_forward_and_backward_match_float64(mode, dtype, shape, layout):
    rng = np.random.default_rng(3)
    x = R.rounded(rng.uniform(-6, 6, shape), dtype)
    dy = R.rounded(rng.uniform(-2, 2, shape), dtype)
    X, DY = R.device(x, dtype, layout), R.device(dy, dtype, layout)
    y_ref, grad = gelu_ref(mode, x)
    for call in range(2):  # the second call runs the plan the first one built
        Y = activation_forward(X, mode)
        _check(R.host(Y), y_ref, dtype, f"forward, call {call + 1}")
        DX = activation_backward(Y, DY, X, mode)
        _check(R.host(DX), dy * grad, dtype, f"backward, call {call + 1}")
        assert DX.shape == x.shape and Y.shape == x.shape


@pytest.mark.parametrize("mode", ["gelu", "gelu_tanh"])
def test_gelu_in_place_and_into_out(mode):
    x = R.rounded(np.linspace(-5, 5, 4 * 64 * 16).reshape(4, 64, 4, 4), "float32")
    X = pycudnn.from_numpy(x.astype(np.float32))
    y_ref, _ = gelu_ref(mode, x)
    out = pycudnn.from_numpy(np.zeros_like(x, np.float32), memory_format="channels_last")
    assert activation_forward(X, mode, out=out) is out
    _check(R.host(out), y_ref, "float32", "into a channels-last out")
    assert activation_forward(X, mode, out=X) is X
    _check(R.host(X), y_ref, "float32", "in place")


def test_gelu_on_an_unaligned_view_goes_through_copies():
    x = R.rounded(np.linspace(-3, 3, 1025), "float16")
    buf = pycudnn.from_numpy(x.astype(np.float16))
    # one element in: 2 bytes past a 16-byte boundary
    X = pycudnn.tensor_from_pointer(buf.ptr + 2, (1024,), "float16", device=buf.device,
                                    owner=buf)
    y_ref, _ = gelu_ref("gelu", x[1:])
    _check(R.host(activation_forward(X, "gelu")), y_ref, "float16", "unaligned")


def test_gelu_is_pytorchs():
    torch = pytest.importorskip("torch")
    x = np.linspace(-8, 8, 2 * 64 * 8 * 8).reshape(2, 64, 8, 8)
    dy = np.cos(x)
    X = pycudnn.from_numpy(x.astype(np.float32))
    DY = pycudnn.from_numpy(dy.astype(np.float32))
    for mode, approximate in (("gelu", "none"), ("gelu_tanh", "tanh")):
        xt = torch.tensor(x.astype(np.float32)).double().requires_grad_(True)
        ref = torch.nn.functional.gelu(xt, approximate=approximate)
        ref.backward(torch.tensor(dy.astype(np.float32)).double())
        Y = activation_forward(X, mode)
        _check(R.host(Y), ref.detach().numpy(), "float32", f"{mode} forward")
        _check(R.host(activation_backward(Y, DY, X, mode)), xt.grad.numpy(), "float32",
               f"{mode} backward")
