"""Batch normalization and dropout on the GPU against independent float64 references
(tests/reference_bn.py), every mode x dtype x layout; the backward pass against central finite
differences; the fused batch norm + add + ReLU against the composition; dropout's mask statistics,
seeds and reuse. Also runs the CPU module's validation and fuzz in a process that sees no GPU."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import reference_bn as R

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import pycudnn  # noqa: E402
from pycudnn.ops import batchnorm as bn  # noqa: E402
from pycudnn.ops import dropout as dr  # noqa: E402

MODES = ["spatial", "per_activation", "spatial_persistent"]
DTYPES = ["float32", "float16", "bfloat16", "float64"]
LAYOUTS = ["nchw", "nhwc", "strided"]
# relative to the largest reference value; half precision rounds y to 2^-11 / 2^-8
TOL = {"float64": 1e-10, "float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}


def tdtype(name):
    return getattr(torch, name)


def make(shape, dtype, layout, seed, scale=1.0, shift=0.0):
    """A CUDA tensor of ``shape`` in ``layout``: NCHW-contiguous, channels-last, or a strided
    view that is dense in neither (every other element of a wider tensor)."""
    g = torch.Generator().manual_seed(seed)
    host = torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift
    if layout == "strided":
        wide = torch.zeros(shape[:-1] + (2 * shape[-1],), dtype=torch.float64)
        wide[..., ::2] = host
        return wide.to("cuda", tdtype(dtype))[..., ::2]
    t = host.to("cuda", tdtype(dtype))
    if layout == "nhwc" and t.dim() in (4, 5):
        t = t.to(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)
    return t


def np64(t):
    if isinstance(t, pycudnn.Tensor):
        return t.numpy().astype(np.float64)
    return t.detach().double().cpu().numpy()


def close(actual, expected, dtype, what=""):
    expected = np.asarray(expected, np.float64)
    actual = np64(actual) if not isinstance(actual, np.ndarray) else actual.astype(np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    scale = max(np.abs(expected).max(), 1e-3)
    err = np.abs(actual - expected).max() / scale
    assert err <= TOL[dtype], f"{what}: relative error {err:.2e} > {TOL[dtype]:.0e}"


def pdtype(dtype):
    return "float64" if dtype == "float64" else "float32"


def params(shape, dtype, mode, seed):
    ps = (shape[1],) if mode != "per_activation" else tuple(shape[1:])
    g = torch.Generator().manual_seed(seed)
    mk = lambda s, off: (torch.randn(ps, generator=g, dtype=torch.float64) * s + off).to(  # noqa: E731
        "cuda", tdtype(pdtype(dtype)))
    return mk(0.5, 1.0), mk(0.5, 0.0), mk(0.2, 0.0), mk(0.2, 1.0)  # weight, bias, rm, rv>0


SHAPES = {"nchw": (4, 8, 5, 6), "nhwc": (4, 8, 5, 6), "strided": (4, 8, 5, 6)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_forward_training_against_reference(mode, dtype, layout):
    shape = SHAPES[layout]
    x = make(shape, dtype, layout, 1, scale=2.0, shift=0.5)
    w, b, rm, rv = params(shape, dtype, mode, 2)
    rm0, rv0 = np64(rm), np64(rv)
    y, sm, si = bn.batch_norm_forward_training(x, w, b, rm, rv, momentum=0.25, eps=1e-4,
                                               mode=mode)
    ry, rmean, rinv, rrm, rrv = R.forward_training(np64(x), np64(w), np64(b), rm0, rv0, 0.25,
                                                   1e-4, mode)
    close(y, ry, dtype, "y")
    st = "float64" if dtype == "float64" else "float32"
    close(sm, rmean.reshape(np64(sm).shape), st if dtype in ("float32", "float64") else "float16",
          "save_mean")
    close(si, rinv.reshape(np64(si).shape), st if dtype in ("float32", "float64") else "float16",
          "save_invstd")
    stat_dtype = dtype if dtype in ("float32", "float64") else "float16"
    close(rm, rrm.reshape(rm0.shape), stat_dtype, "running_mean")
    close(rv, rrv.reshape(rv0.shape), stat_dtype, "running_var (unbiased)")


def test_running_var_is_updated_with_the_unbiased_variance():
    """Told apart sharply: a batch of 2 per channel has unbiased variance twice the biased one."""
    x = torch.tensor([[1.0, 5.0], [3.0, -1.0]], device="cuda").reshape(2, 2)  # (N=2, C=2)
    w, b = torch.ones(2, device="cuda"), torch.zeros(2, device="cuda")
    rm, rv = torch.zeros(2, device="cuda"), torch.zeros(2, device="cuda")
    bn.batch_norm_forward_training(x, w, b, rm, rv, momentum=1.0, eps=0.0)
    assert np.allclose(rm.cpu().numpy(), [2.0, 2.0])
    assert np.allclose(rv.cpu().numpy(), [2.0, 18.0])  # biased would be [1, 9]


@pytest.mark.parametrize("shape", [(6, 5), (3, 4, 7), (2, 3, 3, 4, 5)], ids=["2d", "3d", "5d"])
@pytest.mark.parametrize("mode", ["spatial", "per_activation"])
def test_other_ranks(shape, mode):
    x = make(shape, "float32", "nchw", 3)
    w, b, rm, rv = params(shape, "float32", mode, 4)
    y, sm, si = bn.batch_norm_forward_training(x, w, b, rm, rv, mode=mode)
    ry = R.forward_training(np64(x), np64(w), np64(b), None, None, 0.1, 1e-5, mode)[0]
    close(y, ry, "float32", "y")
    dy = make(shape, "float32", "nchw", 5)
    dx, dw, db = bn.batch_norm_backward(x, dy, w, sm, si, mode=mode)
    rdx, rdw, rdb = R.backward(np64(x), np64(dy), np64(w), 1e-5, mode)
    close(dx, rdx, "float32", "dx")
    close(dw, rdw.reshape(np64(dw).shape), "float32", "dweight")
    close(db, rdb.reshape(np64(db).shape), "float32", "dbias")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["spatial", "per_activation"])
def test_inference_against_reference(mode, dtype, layout):
    shape = SHAPES[layout]
    x = make(shape, dtype, layout, 6)
    w, b, rm, rv = params(shape, dtype, mode, 7)
    y = bn.batch_norm_forward_inference(x, w, b, rm, rv, eps=1e-3, mode=mode)
    close(y, R.forward_inference(np64(x), np64(w), np64(b), np64(rm), np64(rv), 1e-3, mode),
          dtype, "y")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_backward_against_reference(mode, dtype, layout):
    shape = SHAPES[layout]
    x = make(shape, dtype, layout, 8, scale=1.5)
    dy = make(shape, dtype, "nchw" if layout != "nchw" else "nhwc", 9)  # another layout than x
    w, b, _, _ = params(shape, dtype, mode, 10)
    res = bn.batch_norm_forward_training(x, w, b, mode=mode, eps=1e-4)
    dx, dw, db = bn.batch_norm_backward(x, dy, w, res[1], res[2], eps=1e-4, mode=mode,
                                        reserve=res.reserve)
    rdx, rdw, rdb = R.backward(np64(x), np64(dy), np64(w), 1e-4, mode)
    close(dx, rdx, dtype, "dx")
    st = dtype if dtype in ("float32", "float64") else "float16"
    close(dw, rdw.reshape(np64(dw).shape), st, "dweight")
    close(db, rdb.reshape(np64(db).shape), st, "dbias")
    # without the saved statistics cuDNN recomputes them: same gradients
    dx2, _, _ = bn.batch_norm_backward(x, dy, w, None, None, eps=1e-4, mode=mode)
    close(dx2, rdx, dtype, "dx (statistics recomputed)")


@pytest.mark.parametrize("mode", ["spatial", "per_activation"])
def test_backward_matches_finite_differences(mode):
    """cuDNN's float64 backward against central differences of its own forward pass."""
    shape = (3, 2, 2, 3)
    x = make(shape, "float64", "nchw", 11)
    w, b, _, _ = params(shape, "float64", mode, 12)
    g = make(shape, "float64", "nchw", 13)
    eps, h = 1e-3, 1e-6

    def loss(xx, ww, bb):
        y = bn.batch_norm_forward_training(xx, ww, bb, eps=eps, mode=mode)[0]
        return float((np64(y) * np64(g)).sum())

    _, sm, si = bn.batch_norm_forward_training(x, w, b, eps=eps, mode=mode)
    dx, dw, db = bn.batch_norm_backward(x, g, w, sm, si, eps=eps, mode=mode)
    for name, arr, grad in (("x", x, dx), ("weight", w, dw), ("bias", b, db)):
        num = np.zeros(arr.numel())
        for i in range(arr.numel()):
            plus, minus = arr.clone(), arr.clone()
            plus.view(-1)[i] += h
            minus.view(-1)[i] -= h
            args_p = [plus if n == name else o for n, o in (("x", x), ("weight", w), ("bias", b))]
            args_m = [minus if n == name else o for n, o in (("x", x), ("weight", w), ("bias", b))]
            num[i] = (loss(*args_p) - loss(*args_m)) / (2 * h)
        assert np.allclose(np64(grad).reshape(-1), num, rtol=1e-5, atol=1e-7), name


def test_out_and_saved_outputs_with_other_strides():
    shape = (4, 6, 3, 5)
    x = make(shape, "float32", "nhwc", 14)
    w, b, rm, rv = params(shape, "float32", "spatial", 15)
    out = torch.full(shape, float("nan"), device="cuda")  # NCHW: another layout than x
    sm_wide = torch.full((12,), float("nan"), device="cuda")
    si = torch.full((6,), float("nan"), device="cuda")
    rm_wide = torch.zeros(12, device="cuda")
    rm_wide[::2] = rm
    rm_view = rm_wide[::2]
    res = bn.batch_norm_forward_training(x, w, b, rm_view, rv, out=out, save_mean=sm_wide[::2],
                                         save_invstd=si)
    ry, rmean, rinv, rrm, _ = R.forward_training(np64(x), np64(w), np64(b), np64(rm), np64(rv),
                                                 0.1, 1e-5, "spatial")
    assert res[0].ptr == out.data_ptr()
    close(out, ry, "float32", "out")
    close(sm_wide[::2], rmean, "float32", "save_mean (strided)")
    assert torch.isnan(sm_wide[1::2]).all()  # the gaps were left alone
    close(si, rinv, "float32", "save_invstd")
    close(rm_view, rrm, "float32", "running_mean (strided)")
    assert (rm_wide[1::2] == 0).all()


def test_stream_and_no_running_stats():
    s = torch.cuda.Stream()
    x = make((8, 4, 6, 6), "float16", "nhwc", 16)
    w, b, _, _ = params((8, 4, 6, 6), "float16", "spatial", 17)
    torch.cuda.current_stream().synchronize()
    with torch.cuda.stream(s):
        y, _, _ = bn.batch_norm_forward_training(x, w, b, mode="spatial_persistent",
                                                 stream=s.cuda_stream)
    s.synchronize()
    close(y, R.forward_training(np64(x), np64(w), np64(b), None, None, 0.1, 1e-5,
                                "spatial")[0], "float16", "y")


def test_bad_reserve_layout_is_refused():
    x = make((4, 8, 5, 6), "float16", "nhwc", 18)
    w, b, _, _ = params((4, 8, 5, 6), "float16", "spatial", 19)
    res = bn.batch_norm_forward_training(x, w, b, mode="spatial_persistent")
    if res.reserve is None:
        pytest.skip("cuDNN asked for no reserve space for this layout")
    other = make((4, 8, 5, 6), "float16", "nchw", 20)
    with pytest.raises(ValueError, match="reserve"):
        bn.batch_norm_backward(other, other, w, res[1], res[2], mode="spatial_persistent",
                               reserve=res.reserve)


# ---- fused batch norm + add + ReLU -------------------------------------------------------------------

ADD_RELU_CASES = [  # (dtype, layout, mode, fused expected)
    ("float16", "nhwc", "spatial_persistent", True),
    ("bfloat16", "nhwc", "spatial_persistent", None),  # cuDNN's documentation names half only
    ("float16", "nchw", "spatial_persistent", False),
    ("float32", "nhwc", "spatial_persistent", False),
    ("float32", "nchw", "spatial", False),
    ("float64", "nchw", "spatial", False),
    ("float16", "nhwc", "spatial", False),
]


@pytest.mark.parametrize("dtype, layout, mode, fused", ADD_RELU_CASES,
                         ids=[f"{d}-{l}-{m}" for d, l, m, _ in ADD_RELU_CASES])
def test_add_relu_against_the_composition(dtype, layout, mode, fused):
    shape = (4, 8, 6, 5)
    x = make(shape, dtype, layout, 21, scale=2.0)
    w, b, rm, rv = params(shape, dtype, "spatial", 22)
    ref_bn, rmean, rinv, rrm, rrv = R.forward_training(np64(x), np64(w), np64(b), np64(rm),
                                                       np64(rv), 0.1, 1e-5, "spatial")
    # z keeps the ReLU's input at least 0.25 away from 0, where rounding cannot flip the mask
    g = np.random.default_rng(23)
    target = np.where(g.random(shape) < 0.5, -1, 1) * (0.25 + g.random(shape))
    z_host = torch.from_numpy(target - ref_bn)
    z = z_host.to("cuda", tdtype(dtype))
    if layout == "nhwc":
        z = z.to(memory_format=torch.channels_last)
    y, sm, si, reserve = bn.batch_norm_add_relu_forward_training(x, z, w, b, rm, rv, mode=mode)
    if fused is not None:
        assert (reserve is not None) == fused, f"fused kernel used: {reserve is not None}"
    pre = ref_bn + np64(z)
    close(y, np.maximum(pre, 0), dtype, "y")
    close(sm, rmean, "float32" if dtype != "float64" else dtype, "save_mean")
    close(rm, rrm, "float32" if dtype != "float64" else dtype, "running_mean")
    close(rv, rrv, "float16" if dtype in ("float16", "bfloat16") else dtype, "running_var")
    dy = make(shape, dtype, layout, 24)
    dx, dz, dw, db = bn.batch_norm_add_relu_backward(x, y, dy, w, b, sm, si, reserve, mode=mode)
    dpre = np64(dy) * (pre > 0)
    rdx, rdw, rdb = R.backward(np64(x), dpre, np64(w), 1e-5, "spatial")
    close(dz, dpre, dtype, "dz")
    close(dx, rdx, dtype, "dx")
    st = "float16" if dtype in ("float16", "bfloat16") else dtype
    close(dw, rdw, st, "dweight")
    close(db, rdb, st, "dbias")


# ---- dropout -----------------------------------------------------------------------------------------

def _dropout_input(shape, dtype="float32", layout="nchw"):
    t = make(shape, dtype, layout, 30)
    return t.abs_().add_(1)  # no zeros of its own; in place, so a strided view stays strided


@pytest.mark.parametrize("p", [0.3, 0.5, 0.9, 0.99])
def test_dropout_mask_statistics(p):
    x = _dropout_input((1 << 22,))
    state = dr.DropoutState(p, seed=1)
    y, reserve = dr.dropout_forward(x, state)
    yh, xh = np64(y), np64(x)
    dropped = yh == 0
    assert abs(dropped.mean() - p) < 0.003, dropped.mean()
    # cuDNN takes the probability as a C float and scales float32 data in float32: the scale is
    # 1 / (1 - float32(p)) (1 - float32(p) is exact for p >= 0.5), up to a rounding of the
    # quotient and of the product (each <= eps/2): 4 float32 eps bounds it. Against float64 p
    # the scale differs by 8 eps at p = 0.99 (float32(0.99) is 0.99 + 9.5e-9).
    scale = 1.0 / (1.0 - float(np.float32(p)))
    rtol = 4 * float(np.finfo(np.float32).eps)
    assert np.allclose(yh[~dropped], xh[~dropped] * scale, rtol=rtol, atol=0)
    dy = make((1 << 22,), "float32", "nchw", 31)
    dx = dr.dropout_backward(dy, state, reserve)
    expect = np.where(dropped, 0.0, np64(dy) * scale)
    assert np.allclose(np64(dx), expect, rtol=rtol, atol=0)


def test_dropout_p_zero_is_identity():
    x = _dropout_input((64, 33))
    state = dr.DropoutState(0.0, seed=3)
    y, reserve = dr.dropout_forward(x, state)
    assert np.array_equal(np64(y), np64(x))
    dy = make((64, 33), "float32", "nchw", 32)
    assert np.array_equal(np64(dr.dropout_backward(dy, state, reserve)), np64(dy))


def _mask(x, state):
    return np64(dr.dropout_forward(x, state)[0]) == 0


def test_dropout_seeds_and_reuse():
    x = _dropout_input((1 << 16,))
    a, b, c = dr.DropoutState(0.5, seed=7), dr.DropoutState(0.5, seed=7), dr.DropoutState(0.5, 8)
    a1, a2 = _mask(x, a), _mask(x, a)
    b1, b2 = _mask(x, b), _mask(x, b)
    c1 = _mask(x, c)
    assert np.array_equal(a1, b1) and np.array_equal(a2, b2)  # same seed, same sequence
    assert (a1 != a2).mean() > 0.3  # the state advances: a new mask per call
    assert (a1 != c1).mean() > 0.3  # another seed, another mask
    a.reset(7)
    assert np.array_equal(_mask(x, a), a1)  # reset starts the sequence over
    a.reset()
    assert a.seed == 7 and np.array_equal(_mask(x, a), a1)


def test_dropout_p_setter_keeps_the_rng_state():
    x = _dropout_input((1 << 16,))
    a, b = dr.DropoutState(0.5, seed=9), dr.DropoutState(0.5, seed=9)
    a1, a2 = _mask(x, a), _mask(x, a)
    b1 = _mask(x, b)
    b.p = 0.2
    b.p = 0.5
    b2 = _mask(x, b)
    assert np.array_equal(a1, b1) and np.array_equal(a2, b2)  # no re-initialisation
    b.p = 0.1
    frac = _mask(x, b).mean()
    assert abs(frac - 0.1) < 0.01


def test_dropout_backward_uses_the_forward_mask_across_layouts_and_p_changes():
    shape = (4, 6, 5, 7)
    x = _dropout_input(shape, "float32", "nhwc")
    state = dr.DropoutState(0.4, seed=11)
    y, reserve = dr.dropout_forward(x, state)
    state.p = 0.7  # backward scales as its forward pass did
    dy = make(shape, "float32", "nchw", 33)  # another element order than x
    out = torch.full(shape, float("nan"), device="cuda")
    dx = dr.dropout_backward(dy, state, reserve, out=out)
    assert dx.ptr == out.data_ptr()
    mask = np64(y) == 0
    assert np.allclose(np64(out), np.where(mask, 0, np64(dy) / 0.6), rtol=1e-6)
    assert state.p == 0.7


@pytest.mark.parametrize("layout", ["nchw", "strided"])
def test_dropout_refuses_bfloat16_before_any_launch(layout):
    shape = (8, 3, 16, 20)
    x = _dropout_input(shape, "bfloat16", layout)
    out = torch.full(shape, 7.0, dtype=torch.bfloat16, device="cuda")
    state = dr.DropoutState(0.25, seed=12)
    with pytest.raises(TypeError, match=r"dropout_forward: expected input to have dtype "
                                        r"float16, float32 or float64 .* but got bfloat16"):
        dr.dropout_forward(x, state, out=out)
    assert bool((out == 7.0).all())


@pytest.mark.parametrize("dtype", ["float16", "float64"])
@pytest.mark.parametrize("layout", ["nchw", "strided"])
def test_dropout_dtypes_and_strides(dtype, layout):
    shape = (8, 3, 16, 20)
    x = _dropout_input(shape, dtype, layout)
    state = dr.DropoutState(0.25, seed=12)
    y, reserve = dr.dropout_forward(x, state)
    yh, xh = np64(y), np64(x)
    dropped = yh == 0
    assert abs(dropped.mean() - 0.25) < 0.02
    rtol = {"float16": 2e-3, "float64": 1e-7}[dtype]
    assert np.allclose(yh[~dropped], xh[~dropped] / 0.75, rtol=rtol)
    dy = make(shape, dtype, "nchw", 34)
    dx = dr.dropout_backward(dy, state, reserve)
    assert np.allclose(np64(dx), np.where(dropped, 0, np64(dy) / 0.75), rtol=rtol, atol=1e-6)


def test_dropout_state_on_a_stream_and_empty_input():
    s = torch.cuda.Stream()
    state = dr.DropoutState(0.5, seed=13, stream=s.cuda_stream)
    x = torch.empty(0, 4, device="cuda")
    y, reserve = dr.dropout_forward(x, state)
    assert tuple(y.shape) == (0, 4) and reserve.nbytes == 0
    assert tuple(dr.dropout_backward(x, state, reserve).shape) == (0, 4)


# ---- the CPU module, where no GPU is visible ---------------------------------------------------------

def test_cpu_validation_and_fuzz_without_gpu():
    """The CPU module's valid cases end in NoDeviceError on made-up addresses: run it where CUDA
    sees no device, so those addresses never reach this GPU."""
    here = pathlib.Path(__file__).resolve().parent
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(here / "test_ops_batchnorm_dropout.py")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=here.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout.strip().splitlines()[-1], proc.stdout[-2000:]
