"""Values at the edges, on a GPU: NaN, +-inf, +-0 and the kinks of every activation, forward and
backward, and batch-norm inference, give the same values before and after a signature switches to
its runtime-compiled kernel, and PyTorch's values (float64 on the CPU, cuDNN off); float16/bfloat16
ELU backward of a one-element tensor and float16 softmax backward are accurate to within their
dtype's rounding of float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

import test_ops_gpu as R

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import pycudnn  # noqa: E402
from pycudnn.ops import runtime_kernels as rk  # noqa: E402
from pycudnn.ops.activation import activation_backward, activation_forward  # noqa: E402
from pycudnn.ops.batchnorm import batch_norm_forward_inference  # noqa: E402
from pycudnn.ops.softmax import softmax_backward, softmax_forward  # noqa: E402

SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 6.0, 1e30, -1e30, 2.5, -2.5]
ACT = [("relu", 0.0), ("clipped_relu", 6.0), ("clipped_relu", math.inf), ("elu", 1.0),
       ("elu", 0.5), ("swish", 1.0), ("swish", 0.0), ("sigmoid", 0.0), ("tanh", 0.0)]
# where cuDNN's legacy kernel takes the other one-sided derivative than PyTorch at a kink
# (measured on an H200; these signatures stay on the legacy kernel, see runtime_kernels)
LEGACY_KINKS = {("clipped_relu", 6.0): [6.0], ("elu", 0.5): [0.0, -0.0]}


@pytest.fixture(autouse=True)
def switch_at_the_second_call():
    rk.configure(min_bytes=0, after_calls=2, background=False)
    yield
    rk.configure(after_calls=3, background=True, enabled=True, min_bytes=rk.MIN_BYTES)


def _torch_act(mode, coef, x):
    F = torch.nn.functional
    if mode == "relu":
        return F.relu(x)
    if mode == "clipped_relu":
        return F.hardtanh(x, 0.0, coef)
    if mode == "elu":
        return F.elu(x, coef)
    if mode == "swish":
        return F.silu(x) if coef == 1.0 else x * torch.sigmoid(coef * x)
    return getattr(torch, mode)(x)


def torch_reference(mode, coef, x, dy):
    """(y, dx) of PyTorch in float64 on the CPU."""
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    y = _torch_act(mode, coef, xt)
    y.backward(torch.tensor(dy, dtype=torch.float64))
    return y.detach().numpy(), xt.grad.numpy()


def same_values(a, b, where=None, tol=1e-5):
    """NaN where the other is NaN, infinities equal, finite values within ``tol`` (relative,
    float32's rounding by default)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if where is not None:
        a, b = a[where], b[where]
    nan = np.isnan(b)
    if not np.array_equal(np.isnan(a), nan):
        return False
    a, b = a[~nan], b[~nan]
    inf = ~np.isfinite(b)
    if not np.array_equal(a[inf], b[inf]):
        return False
    return bool(np.all(np.abs(a[~inf] - b[~inf]) <= tol * np.maximum(np.abs(b[~inf]), 1.0)))


def _edges(n_rows=64):
    # the special values repeated in a dense channels-last block of 2 * 8 * 8 * 64 elements,
    # which the graph API can address (flat_layout) with dy values that differ per element
    x = np.tile(np.array(SPECIAL), 2 * 8 * 8 * n_rows // len(SPECIAL) + 1)[:2 * 8 * 8 * n_rows]
    dy = np.random.default_rng(0).uniform(0.5, 3.0, x.size)
    return x.reshape(2, 8, 8, n_rows), dy.reshape(2, 8, 8, n_rows)


def _runs(mode, coef):
    """(x, dy, forward results of calls 1-4, backward results of calls 1-4)."""
    x, dy = _edges()
    X = pycudnn.from_numpy(x.astype(np.float32), memory_format="channels_last")
    DY = pycudnn.from_numpy(dy.astype(np.float32), memory_format="channels_last")
    ys = [R.host(activation_forward(X, mode, coef=coef)) for _ in range(4)]
    Y = activation_forward(X, mode, coef=coef)
    dxs = [R.host(activation_backward(Y, DY, X, mode, coef=coef)) for _ in range(4)]
    return x.astype(np.float32).astype(np.float64), dy.astype(np.float32).astype(np.float64), \
        ys, dxs


@pytest.mark.parametrize("mode,coef", ACT, ids=[f"{m}-{c}" for m, c in ACT])
def test_activation_edge_values_hold_across_the_switch(mode, coef):
    _, _, ys, dxs = _runs(mode, coef)
    for k in range(1, 4):  # calls 3 and 4 run the compiled kernel where there is one
        assert same_values(ys[k], ys[0]), f"forward changed at call {k + 1}"
        assert same_values(dxs[k], dxs[0]), f"backward changed at call {k + 1}"


#: where cuDNN's kernels' value at an edge is not PyTorch's yet (seen on the H200, cuDNN 9.19):
#: ReLU's gradient at x = +-0 (dy instead of 0), clipped ReLU's at +inf, swish's and tanh's
#: backward. Stating PyTorch's rule there needs a select op in the graph API's pointwise kernels.
_NOT_PYTORCHS_YET = {("relu", 0.0), ("clipped_relu", float("inf")), ("swish", 1.0), ("tanh", 0.0)}


@pytest.mark.parametrize("mode,coef", [
    pytest.param(m, c, marks=pytest.mark.xfail(
        strict=True, reason="cuDNN's kernels give another value than PyTorch's at this edge input "
                           "(PyTorch's rule needs a select op the pointwise graphs lack)"))
    if (m, c) in _NOT_PYTORCHS_YET else (m, c) for m, c in ACT], ids=[f"{m}-{c}" for m, c in ACT])
def test_activation_edge_values_are_pytorchs(mode, coef):
    x, dy, ys, dxs = _runs(mode, coef)
    ry, rdx = torch_reference(mode, coef, x, dy)
    keep = np.ones(x.shape, bool)
    if mode == "swish" and coef != 1.0:  # no PyTorch function: x * sigmoid(beta * x) on finite x
        keep &= np.isfinite(x)
    assert same_values(ys[-1], ry, keep), "forward differs from PyTorch's at an edge value"
    for kink in LEGACY_KINKS.get((mode, coef), []):
        keep &= ~((x == kink) & (np.signbit(x) == np.signbit(kink)))
    assert same_values(dxs[-1], rdx, keep), "backward differs from PyTorch's at an edge value"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_batch_norm_inference_edge_values_hold_across_the_switch(dtype):
    x, _ = _edges()
    t = torch.tensor(x).to("cuda", getattr(torch, dtype)).contiguous(
        memory_format=torch.channels_last)
    c = t.shape[1]
    w = torch.linspace(-2, 2, c, device="cuda")
    b = torch.linspace(-1, 1, c, device="cuda")
    rm = torch.linspace(-0.5, 0.5, c, device="cuda")
    rv = torch.linspace(0.5, 2.0, c, device="cuda")
    ys = [batch_norm_forward_inference(t, w, b, rm, rv, eps=1e-5).numpy().astype(np.float64)
          for _ in range(4)]
    # the two kernels round alike to within one unit of the dtype; the edges exactly
    tol = {"float32": 1e-5, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    for k in range(1, 4):  # calls 3 and 4 run the compiled kernel
        assert same_values(ys[k], ys[0], tol=tol), f"batch-norm inference changed at call {k + 1}"
    ref = torch.nn.functional.batch_norm(t.double().cpu(), rm.double().cpu(), rv.double().cpu(),
                                         w.double().cpu(), b.double().cpu(), False, 0.0, 1e-5)
    ref = ref.numpy()
    # PyTorch's values at the edges; 1e30 overflows float16/bfloat16 to inf on the way in
    assert same_values(ys[0], ref, tol=4 * tol)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(), (1,), (3,), (2, 3, 4, 5)])
@pytest.mark.parametrize("xv", [-0.2, -1.3, 0.7, -3.0])
def test_elu_backward_of_half_precision_is_accurate(dtype, shape, xv):
    """PyTorch's OpInfo sample nn.functional.elu #2: a 0-d float16 tensor's gradient was 0.198
    off (bfloat16: 1.0)."""
    rng = np.random.default_rng(5)
    x = R.rounded(np.full(shape, xv) + (rng.uniform(-0.1, 0.1, shape) if shape else 0.0), dtype)
    dy = R.rounded(rng.uniform(0.5, 2.0, shape) if shape else np.float64(1.7), dtype)
    X = pycudnn.from_numpy(np.asarray(x).astype(R.np_dtype(dtype)))
    DY = pycudnn.from_numpy(np.asarray(dy).astype(R.np_dtype(dtype)))
    Y = activation_forward(X, "elu", coef=1.0)
    DX = activation_backward(Y, DY, X, "elu", coef=1.0)
    ref = np.where(x > 0, dy, dy * np.exp(x))  # float64
    got = R.host(DX)
    ulp = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    assert got.shape == ref.shape
    assert np.all(np.abs(got - ref) <= ulp * np.maximum(np.abs(ref), 2.0 ** -14)), (got, ref)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("algorithm", ["accurate", "log"])
@pytest.mark.parametrize("mode,shape", [("instance", (1, 1, 5)), ("instance", (2, 3, 4, 5)),
                                        ("channel", (2, 7, 3)), ("channel", (4, 100)),
                                        ("instance", (2, 4, 64))])
def test_softmax_backward_of_half_precision_is_accurate(dtype, algorithm, mode, shape):
    """Float16 instance mode over (1, 1, 5) was 0.026 off float64 (3.3x the tolerance):
    the sum of y * dy runs in float32 now, as PyTorch's."""
    rng = np.random.default_rng(9)
    x = R.rounded(rng.standard_normal(shape) * 2, dtype)
    X = pycudnn.from_numpy(x.astype(R.np_dtype(dtype)))
    Y = softmax_forward(X, algorithm=algorithm, mode=mode)
    y = R.host(Y)  # the half-precision forward result the backward is given
    dy = R.rounded(rng.standard_normal(shape), dtype)
    DX = softmax_backward(Y, pycudnn.from_numpy(dy.astype(R.np_dtype(dtype))),
                          algorithm=algorithm, mode=mode)
    ref = R.softmax_grad_ref(y, dy, algorithm, mode)
    ulp = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    err = np.abs(R.host(DX) - ref).max() / max(np.abs(ref).max(), 1e-3)
    assert err <= ulp, f"relative error {err:.2e} > {ulp:.1e}"
    # the forward too: within the dtype's rounding of float64
    fref = R.softmax_ref(x, algorithm, mode)
    ferr = np.abs(y - fref).max() / max(np.abs(fref).max(), 1e-3)
    assert ferr <= ulp, f"forward relative error {ferr:.2e} > {ulp:.1e}"
