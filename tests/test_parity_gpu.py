"""What PyTorch accepts, on a GPU, computed as PyTorch computes it: pooling with ceil_mode and divisor_override,
convolution with padding='same' (an odd total too) and 'valid', conv_transpose with
output_padding at least the stride (below the dilation), batch norm with momentum outside
[0, 1]. References: PyTorch in float64 on the CPU (cuDNN plays no part there) and the float64
NumPy batch norm of reference_bn.py."""

from __future__ import annotations

import numpy as np
import pytest

import reference_bn as RB

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
F = torch.nn.functional

import pycudnn  # noqa: E402
from pycudnn.ops.batchnorm import batch_norm_forward_training  # noqa: E402
from pycudnn.ops.pooling import pooling_backward, pooling_forward  # noqa: E402

TOL = {"float64": 1e-12, "float32": 2e-5}


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-6))


def host64(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def _torch_pool(x, k, s, p, mode, ceil, divisor=None):
    """(y, dx for dy) in float64 on the CPU."""
    xt = torch.tensor(x, requires_grad=True)
    if mode.startswith("max"):
        y = F.max_pool2d(xt, k, s, p, ceil_mode=ceil)
    else:
        y = F.avg_pool2d(xt, k, s, p, ceil_mode=ceil,
                         count_include_pad=mode == "average_include_padding",
                         divisor_override=divisor)
    return xt, y


# x size, kernel, stride, padding: partial last windows (ceil adds one), and none
GEOMETRIES = [((8, 9), 3, 2, 0), ((8, 9), 3, 2, 1), ((7, 7), 2, 2, 0), ((10, 6), 3, 3, 1),
              ((7, 7), 3, 2, 1)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", ["max", "max_deterministic", "average_exclude_padding",
                                  "average_include_padding"])
@pytest.mark.parametrize("geo", GEOMETRIES, ids=[f"{g[0]}k{g[1]}s{g[2]}p{g[3]}"
                                                for g in GEOMETRIES])
def test_pooling_ceil_mode_is_pytorchs(dtype, mode, geo):
    hw, k, s, p = geo
    x = host64((2, 3) + hw, 1)
    xt, ref = _torch_pool(x, k, s, p, mode, True)
    floor_shape = F.max_pool2d(torch.zeros((1, 1) + hw), k, s, p).shape
    X = pycudnn.from_numpy(x.astype(dtype))
    assert ref.shape[2:] != floor_shape[2:] or geo == ((7, 7), 3, 2, 1)  # ceil adds a window
    Y = pooling_forward(X, k, stride=s, padding=p, mode=mode, ceil_mode=True)
    assert rel(Y.numpy(), ref.detach().numpy()) <= TOL[dtype]
    dy = host64(ref.shape, 2)
    ref.backward(torch.tensor(dy))
    DX = pooling_backward(Y, pycudnn.from_numpy(dy.astype(dtype)), X, k, stride=s, padding=p,
                          mode=mode, ceil_mode=True)
    assert rel(DX.numpy(), xt.grad.numpy()) <= TOL[dtype]


CEIL_INCLUDE = [((8, 9), (3, 2), (2, 3), (1, 0)), ((5, 13), 4, 3, 2), ((10, 6), 3, 1, 1)]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("divisor", [None, 5])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("geo", CEIL_INCLUDE, ids=["k32s23p10", "k4s3p2", "k3s1p1"])
def test_ceil_mode_include_padding_divisor_is_pytorchs(dtype, divisor, layout, geo):
    """A partial last window's include-padding (or divisor_override) divisor is PyTorch's, forward
    and backward, also into a strided out= and from a strided dy, and the caller's dy stays."""
    import ml_dtypes

    hw, k, s, p = geo
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    tol = {"float16": 2e-3, "bfloat16": 1.6e-2}.get(dtype) or TOL[dtype]
    xq = host64((2, 3) + hw, 11).astype(np_dtype)  # PyTorch is given the values X holds
    xt, ref = _torch_pool(xq.astype(np.float64), k, s, p, "average_include_padding", True,
                          divisor)
    want = ref.detach().numpy()
    X = pycudnn.from_numpy(xq, memory_format=layout)
    kw = dict(stride=s, padding=p, mode="average_include_padding", ceil_mode=True,
              divisor_override=divisor)
    for _ in range(2):  # the second call takes the remembered plan
        Y = pooling_forward(X, k, **kw)
        assert rel(Y.numpy(), want) <= tol
    n, c, h, w = want.shape
    big = pycudnn.from_numpy(np.full((n, c, h, 2 * w), np.nan, np_dtype))
    out = pycudnn.tensor_from_pointer(big.ptr, want.shape, big.dtype, owner=big,
                                      strides=(c * h * 2 * w, h * 2 * w, 2 * w, 2))  # elements
    assert pooling_forward(X, k, out=out, **kw) is out
    b = big.numpy().astype(np.float64)
    assert rel(b[..., ::2], want) <= tol and np.isnan(b[..., 1::2]).all()
    dy = host64(want.shape, 12).astype(np_dtype)
    ref.backward(torch.tensor(dy.astype(np.float64)))
    dy_big = np.zeros((n, c, h, 2 * w), np_dtype)
    dy_big[..., ::2] = dy
    DYB = pycudnn.from_numpy(dy_big)
    DY_strided = pycudnn.tensor_from_pointer(DYB.ptr, want.shape, DYB.dtype, owner=DYB,
                                             strides=out.strides)
    for DY in (pycudnn.from_numpy(dy, memory_format=layout), DY_strided, DY_strided):
        DX = pooling_backward(Y, DY, X, k, **kw)
        assert rel(DX.numpy(), xt.grad.numpy()) <= tol
    assert np.array_equal(DYB.numpy().astype(np.float64), dy_big.astype(np.float64))  # dy stays


@pytest.mark.parametrize("divisor", [None, 4])
def test_ceil_mode_include_padding_3d_is_pytorchs(divisor):
    x = host64((2, 2, 7, 6, 9), 13)
    xt = torch.tensor(x, requires_grad=True)
    ref = F.avg_pool3d(xt, 3, 2, 1, ceil_mode=True, count_include_pad=True,
                       divisor_override=divisor)
    X = pycudnn.from_numpy(x)
    kw = dict(stride=2, padding=1, mode="average_include_padding", ceil_mode=True,
              divisor_override=divisor)
    Y = pooling_forward(X, 3, **kw)
    assert rel(Y.numpy(), ref.detach().numpy()) <= TOL["float64"]
    dy = host64(ref.shape, 14)
    ref.backward(torch.tensor(dy))
    DX = pooling_backward(Y, pycudnn.from_numpy(dy), X, 3, **kw)
    assert rel(DX.numpy(), xt.grad.numpy()) <= TOL["float64"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("divisor", [1, 3, 7, -2])
@pytest.mark.parametrize("geo", [((8, 9), 3, 2, 1), ((6, 6), 2, 2, 0)])
def test_pooling_divisor_override_is_pytorchs(dtype, divisor, geo):
    hw, k, s, p = geo
    x = host64((2, 3) + hw, 3)
    for mode in ("average_include_padding", "average_exclude_padding"):
        xt, ref = _torch_pool(x, k, s, p, mode, False, divisor)
        X = pycudnn.from_numpy(x.astype(dtype))
        Y = pooling_forward(X, k, stride=s, padding=p, mode=mode, divisor_override=divisor)
        assert rel(Y.numpy(), ref.detach().numpy()) <= TOL[dtype]
        dy = host64(ref.shape, 4)
        ref.backward(torch.tensor(dy))
        DX = pooling_backward(Y, pycudnn.from_numpy(dy.astype(dtype)), X, k, stride=s,
                              padding=p, mode=mode, divisor_override=divisor)
        assert rel(DX.numpy(), xt.grad.numpy()) <= TOL[dtype]


@pytest.mark.parametrize("engine", ["v7", "graph"])
@pytest.mark.parametrize("k,d", [(3, 1), (4, 1), (2, 1), (4, 3), (5, 2)])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_convolution_padding_same_is_pytorchs(engine, k, d, layout):
    x = host64((2, 4, 11, 9), 5)
    w = host64((6, 4, k, k), 6)
    b = host64((6,), 7)
    ref = F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), padding="same", dilation=d)
    X = pycudnn.from_numpy(x.astype(np.float32), memory_format=layout)
    W = pycudnn.from_numpy(w.astype(np.float32), memory_format=layout)
    B = pycudnn.from_numpy(b.astype(np.float32))
    for _ in range(2):  # the second call takes the remembered path
        Y = pycudnn.convolution(X, W, B, padding="same", dilation=d, engine=engine,
                                allow_tf32=False, tuning_db=False)
        assert Y.shape == (2, 6, 11, 9)
        assert rel(Y.numpy(), ref.numpy()) <= 1e-5
    Yv = pycudnn.convolution(X, W, padding="valid", engine=engine, allow_tf32=False,
                             tuning_db=False)
    ref_v = F.conv2d(torch.tensor(x), torch.tensor(w), padding="valid")
    assert rel(Yv.numpy(), ref_v.numpy()) <= 1e-5


def test_convolution_padding_same_leaves_x_untouched_and_fills_out():
    x = host64((1, 2, 7, 8), 8).astype(np.float32)
    w = host64((3, 2, 2, 4), 9).astype(np.float32)
    X, W = pycudnn.from_numpy(x), pycudnn.from_numpy(w)
    out = pycudnn.from_numpy(np.full((1, 3, 7, 8), np.nan, np.float32))
    y = pycudnn.convolution(X, W, padding="same", out=out, allow_tf32=False, tuning_db=False)
    assert y is out
    ref = F.conv2d(torch.tensor(x, dtype=torch.float64), torch.tensor(w, dtype=torch.float64),
                   padding="same")
    assert rel(out.numpy(), ref.numpy()) <= 1e-5
    assert np.array_equal(X.numpy(), x)


@pytest.mark.parametrize("stride,dilation,op,padding", [(1, 3, 2, 0), (2, 4, 3, 1), (1, 2, 1, 1),
                                                         (2, 3, 2, 2), (1, 3, 1, 0)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_conv_transpose_output_padding_below_dilation_is_pytorchs(stride, dilation, op,
                                                                  padding, dtype):
    x = host64((2, 4, 5, 6), 10)
    w = host64((4, 3, 3, 3), 11)
    b = host64((3,), 12)
    ref = F.conv_transpose2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride=stride,
                             padding=padding, output_padding=op, dilation=dilation)
    out = pycudnn.conv_transpose(pycudnn.from_numpy(x.astype(dtype)),
                                 pycudnn.from_numpy(w.astype(dtype)),
                                 pycudnn.from_numpy(b.astype(dtype)), stride=stride,
                                 padding=padding, output_padding=op, dilation=dilation,
                                 allow_tf32=False, tuning_db=False)
    assert out.shape == tuple(ref.shape)
    assert rel(out.numpy(), ref.numpy()) <= (1e-5 if dtype == "float32" else 1e-12)


# (x shape, w shape, stride, padding, output_padding, dilation): a padding past the unpadded
# size in H (the output is the bias alone there), one that keeps nothing, an ordinary crop
CROPS = [((1, 2, 1, 3), (2, 3, 1, 3), (1, 1), (2, 0), (4, 0), (5, 1)),
         ((1, 2, 1, 3), (2, 3, 1, 3), (1, 1), (1, 0), (2, 0), (3, 1)),
         ((1, 2, 4, 4), (2, 3, 2, 2), (1, 1), (1, 1), (1, 1), (2, 2))]


@pytest.mark.parametrize("geo", CROPS, ids=[str(g[3:]) for g in CROPS])
def test_conv_transpose_crop_past_the_unpadded_size_is_pytorchs(geo):
    xs, ws, st, pad, op, dil = geo
    x, w, b = host64(xs, 30), host64(ws, 31), host64(ws[1], 32)
    ref = F.conv_transpose2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride=st,
                             padding=pad, output_padding=op, dilation=dil).numpy()
    got = pycudnn.conv_transpose(pycudnn.from_numpy(x), pycudnn.from_numpy(w),
                                 pycudnn.from_numpy(b), stride=st, padding=pad,
                                 output_padding=op, dilation=dil, tuning_db=False).numpy()
    assert rel(got, ref) <= 1e-12


# (x shape, w shape, stride, padding, output_padding, dilation, groups); output_padding at
# least the stride (below the dilation) first, as in PyTorch's OpInfo samples, then below it
TGRADS = [((1, 4, 4, 4), (4, 2, 3, 3), 1, (1, 1), (0, 1), (1, 2), 1),
          ((2, 4, 5, 6), (4, 3, 3, 3), 1, 1, 2, 3, 1),
          ((2, 4, 5, 6), (4, 2, 2, 3), (2, 1), (0, 2), (3, 1), (4, 2), 2),
          ((1, 2, 3, 4, 3), (2, 2, 2, 2, 2), 1, 0, (1, 0, 1), 2, 1),
          ((2, 3, 7), (3, 2, 3), 1, 2, 2, 3, 1),
          ((2, 4, 5, 6), (4, 3, 3, 3), 2, 1, 1, 1, 1),
          ((1, 2, 3, 4, 3), (2, 4, 2, 2, 2), 2, 1, 1, 1, 1)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("geo", TGRADS, ids=[f"{len(g[0]) - 2}d-op{g[4]}-s{g[2]}" for g in TGRADS])
def test_conv_transpose_gradients_are_pytorchs(geo, dtype):
    """conv_transpose_backward_data / _filter against PyTorch's autograd of conv_transpose in
    float64 on the CPU."""
    xs, ws, st, pad, op, dil, g = geo
    fn = {3: F.conv_transpose1d, 4: F.conv_transpose2d, 5: F.conv_transpose3d}[len(xs)]
    x, w = host64(xs, 33), host64(ws, 34)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    y = fn(xt, wt, None, st, pad, op, g, dil)
    gy = host64(tuple(y.shape), 35)
    y.backward(torch.tensor(gy))
    kw = dict(stride=st, padding=pad, output_padding=op, dilation=dil, groups=g,
              allow_tf32=False, tuning_db=False)
    X, W, GY = (pycudnn.from_numpy(a.astype(dtype)) for a in (x, w, gy))
    gx = pycudnn.conv_transpose_backward_data(GY, W, xs, **kw)
    gw = pycudnn.conv_transpose_backward_filter(X, GY, ws, **kw)
    tol = 1e-5 if dtype == "float32" else 1e-12
    assert rel(gx.numpy(), xt.grad.numpy()) <= tol
    assert rel(gw.numpy(), wt.grad.numpy()) <= tol
    # the forward with the same geometry still matches (the gradients' geometry is its own)
    yp = pycudnn.conv_transpose(X, W, stride=st, padding=pad, output_padding=op, dilation=dil,
                                groups=g, allow_tf32=False, tuning_db=False)
    assert rel(yp.numpy(), y.detach().numpy()) <= tol


@pytest.mark.parametrize("momentum", [1.5, -0.2, 3.0])
def test_batch_norm_momentum_outside_zero_one_is_pytorchs(momentum):
    x = host64((4, 3, 5, 5), 13) * 2 + 1
    w, b = host64((3,), 14), host64((3,), 15)
    rm, rv = host64((3,), 16), np.abs(host64((3,), 17)) + 0.5
    RM, RV = pycudnn.from_numpy(rm.astype(np.float32)), pycudnn.from_numpy(rv.astype(np.float32))
    res = batch_norm_forward_training(pycudnn.from_numpy(x.astype(np.float32)),
                                      pycudnn.from_numpy(w.astype(np.float32)),
                                      pycudnn.from_numpy(b.astype(np.float32)), RM, RV,
                                      momentum=momentum, eps=1e-5)
    y, _, _, new_rm, new_rv = RB.forward_training(x, w, b, rm, rv, momentum, 1e-5, "spatial")
    assert rel(res[0].numpy(), y) <= 1e-4
    assert rel(RM.numpy(), new_rm) <= 1e-5
    assert rel(RV.numpy(), new_rv) <= 1e-5


HARDTANH_BOUNDS = [(-1.0, 1.0), (-0.5, 2.0), (0.0, 6.0), (0.1, 0.1), (-2.5, -0.3),
                   (0.0, np.inf), (-np.inf, 0.0), (-np.inf, np.inf), (-np.inf, -np.inf),
                   (np.inf, np.inf)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("bounds", HARDTANH_BOUNDS, ids=[f"{a}:{b}" for a, b in HARDTANH_BOUNDS])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_hardtanh_is_pytorchs_with_its_edges(dtype, bounds, layout):
    """Forward and backward against PyTorch (float64 on the CPU, from the values the device
    holds), exactly: NaN, +-inf, +-0 and the bounds themselves included."""
    lo, hi = bounds
    rng = np.random.default_rng(21)
    x = rng.uniform(-4, 4, (2, 8, 5, 6))
    tdt = {"bfloat16": torch.bfloat16}.get(dtype, getattr(torch, dtype, None))
    big = torch.finfo(tdt).max  # next to an infinite bound: inside it
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, lo, hi, 1.0, -1.0, big, -big]
    x.flat[:len(special) * 20] = np.tile(special, 20)
    dy = rng.uniform(0.5, 2.0, x.shape)
    xd = torch.tensor(x).to(tdt).contiguous(
        memory_format=torch.channels_last if layout == "channels_last" else torch.contiguous_format)
    dyd = torch.tensor(dy).to(tdt).contiguous(memory_format=torch.contiguous_format)
    X, DY = xd.cuda(), dyd.cuda()
    from pycudnn.ops.hardtanh import hardtanh_backward, hardtanh_forward

    y = hardtanh_forward(X, lo, hi)
    dx = hardtanh_backward(DY, X, lo, hi)
    # PyTorch's CUDA kernels (no cuDNN in them), in their opmath (float32 for half types), with
    # the bounds as floats there. Not its CPU kernels: at NaN their scalar path gives 0 and their
    # vectorized path dy, so the CPU result depends on the layout; the CUDA kernel gives dy
    wide = torch.float64 if dtype == "float64" else torch.float32
    xg = xd.to("cuda", wide).requires_grad_(True)
    ref = F.hardtanh(xg, lo, hi)
    ref.backward(dyd.to("cuda", wide))
    ref_y = ref.detach().to(tdt).double().cpu().numpy()
    got_y = torch.as_tensor(y.numpy().astype(np.float64)).numpy()
    got_dx = dx.numpy().astype(np.float64)
    ref_dx = xg.grad.to(tdt).double().cpu().numpy()
    for got, want, what in ((got_y, ref_y, "forward"), (got_dx, ref_dx, "backward")):
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan), what
        assert np.array_equal(got[~nan], want[~nan]), what  # exact: max, min and masks


DILATED = [((9, 9), 3, 1, 1, 2), ((8, 11), 2, 2, 0, 3), ((12, 10), 3, 2, 1, (2, 3)),
           ((7, 9), 2, 3, 1, 2)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ceil", [False, True])
@pytest.mark.parametrize("mode", ["max", "max_deterministic"])
@pytest.mark.parametrize("geo", DILATED, ids=[str(g) for g in DILATED])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_dilated_max_pooling_is_pytorchs(dtype, ceil, mode, geo, layout):
    hw, k, s, p, d = geo
    x = host64((2, 3) + hw, 30).astype(dtype).astype(np.float64)  # the values the device holds
    xt = torch.tensor(x, requires_grad=True)
    ref = F.max_pool2d(xt, k, s, p, d, ceil_mode=ceil)
    X = pycudnn.from_numpy(x.astype(dtype), memory_format=layout)
    Y = pooling_forward(X, k, stride=s, padding=p, dilation=d, mode=mode, ceil_mode=ceil)
    assert rel(Y.numpy(), ref.detach().numpy()) == 0.0  # a maximum: exact
    dy = host64(ref.shape, 31)
    ref.backward(torch.tensor(dy))
    DX = pooling_backward(Y, pycudnn.from_numpy(dy.astype(dtype)), X, k, stride=s, padding=p,
                          dilation=d, mode=mode, ceil_mode=ceil)
    assert rel(DX.numpy(), xt.grad.numpy()) <= TOL[dtype]
