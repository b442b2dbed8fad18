"""Values at the edges, on a GPU: NaN, +-inf, +-0 and the kinks of every
activation, forward and backward, and batch-norm inference, give the same values before and
after a signature switches to its runtime-compiled kernel, and PyTorch's values (float64 on the
CPU, cuDNN off); float16/bfloat16 ELU backward of a one-element tensor and float16 softmax
backward are accurate to within their dtype's rounding of float64."""

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
LEGACY_KINKS = {("elu", 0.5): [0.0, -0.0]}


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


def _where_they_differ(x, got, want, keep):
    """The first few (x, got, want) where ``got`` is not ``want``, for the failure message."""
    bad = [(float(a), float(g), float(w)) for a, g, w, k in
           zip(x.ravel(), np.asarray(got).ravel(), np.asarray(want).ravel(), keep.ravel())
           if k and not same_values([g], [w])]
    return sorted(set(bad), key=str)[:12]


@pytest.mark.parametrize("mode,coef", ACT, ids=[f"{m}-{c}" for m, c in ACT])
def test_activation_edge_values_are_pytorchs(mode, coef):
    x, dy, ys, dxs = _runs(mode, coef)
    ry, rdx = torch_reference(mode, coef, x, dy)
    keep = np.ones(x.shape, bool)
    if mode == "swish" and coef != 1.0:  # no PyTorch function: x * sigmoid(beta * x) on finite x
        keep &= np.isfinite(x)
    assert same_values(ys[-1], ry, keep), \
        f"forward differs from PyTorch's at (x, got, want) {_where_they_differ(x, ys[-1], ry, keep)}"
    for kink in LEGACY_KINKS.get((mode, coef), []):
        keep &= ~((x == kink) & (np.signbit(x) == np.signbit(kink)))
    for k, dx in enumerate(dxs):  # every kernel a signature runs, from the first call on
        assert same_values(dx, rdx, keep), \
            (f"backward call {k + 1} differs from PyTorch's at (x, got, want) "
             f"{_where_they_differ(x, dx, rdx, keep)}")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("mode,coef", [("tanh", 0.0), ("swish", 1.0), ("swish", 0.5)])
def test_tanh_and_swish_gradients_are_within_the_dtypes_rounding_of_float64(mode, coef, dtype):
    # a dense sweep against PyTorch's float64 gradient of the values the dtype holds; 6093
    # elements have no flat block, so the operands also go through the graph's staging copies
    x = np.concatenate([np.linspace(-12, 12, 4093), np.geomspace(1e-6, 1e4, 1000),
                        -np.geomspace(1e-6, 1e4, 1000)]).reshape(1, 1, 6093, 1)
    dy = np.random.default_rng(1).uniform(-2, 2, x.shape)
    tx = torch.tensor(x, dtype=getattr(torch, dtype), device="cuda")
    tdy = torch.tensor(dy, dtype=getattr(torch, dtype), device="cuda")
    y = activation_forward(tx, mode, coef=coef)
    got = R.host(activation_backward(y, tdy, tx, mode, coef=coef))
    _, want = torch_reference(mode, coef, tx.double().cpu().numpy(), tdy.double().cpu().numpy())
    tol = {"float32": 1e-5, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    err = np.abs(got - want) / np.maximum(np.abs(want), 1.0)
    assert err.max() <= tol, f"worst at x = {tx.double().cpu().numpy().ravel()[err.argmax()]}"


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


def _ulps(a, b, dtype):
    """The distance between two half-precision arrays in steps of the dtype (float32 views)."""
    tdt = getattr(torch, dtype)
    ia = torch.as_tensor(a).to(tdt).view(torch.int16).to(torch.int64)
    ib = torch.as_tensor(b).to(tdt).view(torch.int16).to(torch.int64)
    ia = torch.where(ia < 0, -32768 - ia, ia)  # sign-magnitude to a monotone order
    ib = torch.where(ib < 0, -32768 - ib, ib)
    return (ia - ib).abs()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("mode,shape", [("instance", (1, 1, 5)), ("channel", (1, 5)),
                                        ("channel", (4, 100)), ("instance", (2, 3, 4, 5))])
@pytest.mark.parametrize("seed", range(4))
def test_half_softmax_is_pytorchs_on_opinfo_like_samples(dtype, mode, shape, seed):
    """OpInfo's samples (values and gradients uniform in [-9, 9]): PyTorch computes a half
    softmax in float32 and rounds once, and its backward reads that rounded y; a y one rounding
    step off PyTorch's changes dx by up to |dy - sum(y * dy)| times that step (the float16
    instance-mode (5,) sample was 3.3x over tolerance). y is PyTorch's (CPU, same dtype) to
    within one step, and dx from it PyTorch's backward of that y."""
    from torch.testing import make_tensor

    torch.manual_seed(seed)
    tdt = getattr(torch, dtype)
    x = make_tensor(shape, dtype=tdt, device="cpu", low=-9, high=9)
    dy = make_tensor(shape, dtype=tdt, device="cpu", low=-9, high=9)
    flat = (shape[0], -1) if mode == "instance" else shape
    ref_y = torch.softmax(x.reshape(flat), 1).reshape(shape)
    Y = softmax_forward(pycudnn.as_tensor(x.cuda()), mode=mode)
    y = torch.as_tensor(R.host(Y)).to(tdt)
    assert int(_ulps(y, ref_y, dtype).max()) <= 1, (y, ref_y)
    assert float((y == ref_y).float().mean()) >= 0.95
    DX = softmax_backward(Y, pycudnn.as_tensor(dy.cuda()), mode=mode)
    ref_dx = torch._softmax_backward_data(dy.reshape(flat), y.reshape(flat), 1, tdt)
    got = torch.as_tensor(R.host(DX)).to(tdt)
    assert int(_ulps(got, ref_dx.reshape(shape), dtype).max()) <= 1, (got, ref_dx)
