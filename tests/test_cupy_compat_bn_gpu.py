"""pycudnn.cupy_compat's batch normalization and DropoutStates on CuPy arrays, with CuPy 13's
signatures and conventions (``decay``, ``is_for_conv2d``, ``d_layout``, returned tuples), against
the float64 NumPy references of tests/reference_bn.py."""

from __future__ import annotations

import numpy as np
import pytest

import reference_bn as R

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")

from pycudnn import cupy_compat as cc  # noqa: E402

NCHW, NHWC = cc.CUDNN_TENSOR_NCHW, cc.CUDNN_TENSOR_NHWC
MODE_NAMES = {cc.CUDNN_BATCHNORM_SPATIAL: "spatial",
              cc.CUDNN_BATCHNORM_SPATIAL_PERSISTENT: "spatial",
              cc.CUDNN_BATCHNORM_PER_ACTIVATION: "per_activation"}
TOL = {"float64": 1e-10, "float32": 1e-4, "float16": 4e-3}


def close(actual, expected, dtype, what=""):
    a = cupy.asnumpy(actual).astype(np.float64)
    e = np.asarray(expected, np.float64)
    assert a.shape == e.shape, (what, a.shape, e.shape)
    err = np.abs(a - e).max() / max(np.abs(e).max(), 1e-3)
    assert err <= TOL[dtype], f"{what}: relative error {err:.2e}"


def host(shape, seed, scale=1.0, shift=0.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale + shift


def nchw(a, layout):
    """The NCHW float64 view of an array CuPy 13 took in ``layout``."""
    h = cupy.asnumpy(a).astype(np.float64)
    return h.transpose(0, 3, 1, 2) if layout == NHWC else h


@pytest.mark.parametrize("layout", [NCHW, NHWC], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("mode", sorted(MODE_NAMES))
def test_forward_training_backward_and_inference(mode, dtype, layout):
    n, c, h, w = 4, 8, 5, 6
    shape = (n, h, w, c) if layout == NHWC else (n, c, h, w)
    x = cupy.asarray(host(shape, 1, 2.0, 0.5).astype(dtype))
    pshape = (c,) if mode != cc.CUDNN_BATCHNORM_PER_ACTIVATION else (c, h, w)
    if mode == cc.CUDNN_BATCHNORM_PER_ACTIVATION and layout == NHWC:
        pytest.skip("per-activation parameters follow the NCHW view")
    pdt = "float64" if dtype == "float64" else "float32"
    gamma = cupy.asarray(host(pshape, 2, 0.5, 1.0).astype(pdt))
    beta = cupy.asarray(host(pshape, 3).astype(pdt))
    rm = cupy.asarray(host(pshape, 4, 0.2).astype(pdt))
    rv = cupy.asarray((host(pshape, 5, 0.2, 1.0)).astype(pdt))
    rm0, rv0 = cupy.asnumpy(rm), cupy.asnumpy(rv)
    decay = 0.9
    y, mean, inv_std = cc.batch_normalization_forward_training(
        x, gamma, beta, rm, rv, None, None, 1e-4, decay, True, mode, False, layout)
    assert isinstance(y, cupy.ndarray) and y.shape == x.shape and y.dtype == x.dtype
    name = MODE_NAMES[mode]
    x64 = nchw(x, layout)
    ry, rmean, rinv, rrm, rrv = R.forward_training(x64, cupy.asnumpy(gamma), cupy.asnumpy(beta),
                                                   rm0, rv0, 1 - decay, 1e-4, name)
    close(nchw(y, layout), ry, dtype, "y")
    stat = dtype if dtype != "float16" else "float16"
    close(mean, rmean.reshape(pshape), stat, "mean")
    close(inv_std, rinv.reshape(pshape), stat, "inv_std")
    close(rm, rrm.reshape(pshape), stat, "running_mean: decay * old + (1 - decay) * batch")
    close(rv, rrv.reshape(pshape), stat, "running_var (unbiased)")

    gy = cupy.asarray(host(shape, 6).astype(dtype))
    gx, ggamma, gbeta = cc.batch_normalization_backward(x, gamma, gy, mean, inv_std, 1e-4, True,
                                                        mode, False, layout)
    rdx, rdw, rdb = R.backward(x64, nchw(gy, layout), cupy.asnumpy(gamma), 1e-4, name)
    close(nchw(gx, layout), rdx, dtype, "gx")
    close(ggamma, rdw.reshape(pshape), stat, "ggamma")
    close(gbeta, rdb.reshape(pshape), stat, "gbeta")
    assert ggamma.dtype == gamma.dtype and ggamma.shape == gamma.shape

    yi = cc.batch_normalization_forward_inference(x, gamma, beta, rm, rv, 1e-3, True, mode, layout)
    close(nchw(yi, layout), R.forward_inference(x64, cupy.asnumpy(gamma), cupy.asnumpy(beta),
                                                cupy.asnumpy(rm), cupy.asnumpy(rv), 1e-3, name),
          dtype, "inference y")


def test_mean_and_inv_std_given_are_written_and_only_y_returned():
    x = cupy.asarray(host((6, 4, 3, 3), 7).astype("float32"))
    g, b = cupy.ones(4, "float32"), cupy.zeros(4, "float32")
    rm, rv = cupy.zeros(4, "float32"), cupy.ones(4, "float32")
    mean, inv = cupy.full(4, cupy.nan, "float32"), cupy.full(4, cupy.nan, "float32")
    y = cc.batch_normalization_forward_training(x, g, b, rm, rv, mean, inv, 1e-5, 0.9, True,
                                                cc.CUDNN_BATCHNORM_SPATIAL, False)
    assert isinstance(y, cupy.ndarray)
    _, rmean, rinv, _, _ = R.forward_training(cupy.asnumpy(x), np.ones(4), np.zeros(4), None,
                                              None, 0.1, 1e-5, "spatial")
    close(mean, rmean, "float32", "mean")
    close(inv, rinv, "float32", "inv_std")
    with pytest.raises(ValueError, match="Both mean and inv_std"):
        cc.batch_normalization_forward_training(x, g, b, rm, rv, mean, None, 1e-5, 0.9, True,
                                                cc.CUDNN_BATCHNORM_SPATIAL, False)


@pytest.mark.parametrize("fn", ["batch_normalization_forward_training",
                                "batch_normalization_forward_training_ex"])
@pytest.mark.parametrize("kind", ["float16", "non-contiguous float32"])
def test_mean_and_inv_std_of_another_dtype_or_layout_are_written_back(fn, kind):
    """cuDNN computes into converted temporaries, which must reach the caller's arrays: a
    sentinel the caller put there (-123) must be overwritten."""
    c = 8
    dt = "float16" if kind == "float16" else "float32"
    x = cupy.asarray(host((4, c, 5, 5), 11, 2.0, 3.0).astype(dt))
    g = cupy.asarray(host((c,), 12, 0.3, 1.0).astype(dt))
    b = cupy.asarray(host((c,), 13).astype(dt))
    rm, rv = cupy.zeros(c, dt), cupy.ones(c, dt)
    if kind == "float16":
        mean, inv = cupy.full(c, -123, dt), cupy.full(c, -123, dt)
        view_m, view_i = mean, inv
    else:  # (2, 4) arrays seen through their transposes: cuDNN gets dense copies
        mean, inv = cupy.full((4, 2), -123, dt), cupy.full((4, 2), -123, dt)
        view_m, view_i = mean.T, inv.T
    getattr(cc, fn)(x, g, b, rm, rv, view_m, view_i, 1e-5, 0.9, True,
                    cc.CUDNN_BATCHNORM_SPATIAL, False)
    _, rmean, rinv, _, _ = R.forward_training(cupy.asnumpy(x).astype(np.float64),
                                              cupy.asnumpy(g).astype(np.float64),
                                              cupy.asnumpy(b).astype(np.float64), None, None,
                                              0.1, 1e-5, "spatial")
    close(view_m.reshape(-1), rmean, dt, "mean")
    close(view_i.reshape(-1), rinv, dt, "inv_std")


@pytest.mark.parametrize("shape", [(10, 6), (3, 4, 6)], ids=["2d", "3d"])
def test_not_for_conv2d_normalizes_over_all_but_the_last_axis(shape):
    x = cupy.asarray(host(shape, 8, 1.5).astype("float32"))
    c = shape[-1]
    g, b = cupy.asarray(host((c,), 9, 0.3, 1.0).astype("float32")), cupy.zeros(c, "float32")
    rm, rv = cupy.zeros(c, "float32"), cupy.ones(c, "float32")
    y, mean, inv = cc.batch_normalization_forward_training(
        x, g, b, rm, rv, None, None, 1e-5, 0.9, False, cc.CUDNN_BATCHNORM_PER_ACTIVATION, False)
    x2 = cupy.asnumpy(x).reshape(-1, c).astype(np.float64)
    ry, rmean, _, _, _ = R.forward_training(x2, cupy.asnumpy(g), np.zeros(c), None, None, 0.1,
                                            1e-5, "per_activation")
    assert y.shape == x.shape
    close(y.reshape(-1, c), ry, "float32", "y")
    close(mean, rmean, "float32", "mean")


def test_half_parameters_are_converted_like_cupy13():
    """CuPy 13 converted float16 gamma/beta/statistics to cuDNN's float32 and back."""
    x = cupy.asarray(host((4, 8, 3, 3), 10).astype("float16"))
    g, b = cupy.ones(8, "float16"), cupy.zeros(8, "float16")
    rm, rv = cupy.zeros(8, "float16"), cupy.ones(8, "float16")
    y, mean, inv_std = cc.batch_normalization_forward_training(
        x, g, b, rm, rv, None, None, 1e-5, 0.5, True, cc.CUDNN_BATCHNORM_SPATIAL, False)
    _, rmean, _, rrm, rrv = R.forward_training(cupy.asnumpy(x), np.ones(8), np.zeros(8),
                                               np.zeros(8), np.ones(8), 0.5, 1e-5, "spatial")
    assert rm.dtype == "float16" and mean.dtype == "float32" and inv_std.dtype == "float32"
    close(mean, rmean, "float32", "mean")
    close(rm, rrm, "float16", "running_mean (float16)")
    close(rv, rrv, "float16", "running_var (float16)")
    gx, gg, gb = cc.batch_normalization_backward(x, g, cupy.ones_like(x), mean, inv_std, 1e-5,
                                                 True, cc.CUDNN_BATCHNORM_SPATIAL, False)
    assert gg.dtype == "float16" and gb.dtype == "float16"
    close(gb, np.full(8, 4 * 3 * 3.0), "float16", "gbeta")


def test_ex_returns_the_reserve_space_first_and_backward_takes_it():
    x = cupy.asarray(host((8, 6, 7, 16), 11).astype("float16"))  # NHWC, C = 16
    g, b = cupy.ones(16, "float32"), cupy.zeros(16, "float32")
    rm, rv = cupy.zeros(16, "float32"), cupy.ones(16, "float32")
    out = cc.batch_normalization_forward_training_ex(
        x, g, b, rm, rv, None, None, 1e-5, 0.9, True, cc.CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
        True, NHWC)
    assert len(out) == 4
    reserve, y, mean, inv = out
    gy = cupy.asarray(host(x.shape, 12).astype("float16"))
    gx, _, _ = cc.batch_normalization_backward(x, g, gy, mean, inv, 1e-5, True,
                                               cc.CUDNN_BATCHNORM_SPATIAL_PERSISTENT, True, NHWC,
                                               reserve_space=reserve)
    rdx = R.backward(nchw(x, NHWC), nchw(gy, NHWC), np.ones(16), 1e-5, "spatial")[0]
    close(nchw(gx, NHWC), rdx, "float16", "gx")
    two = cc.batch_normalization_forward_training_ex(
        x, g, b, rm, rv, cupy.empty(16, "float32"), cupy.empty(16, "float32"), 1e-5, 0.9, True,
        cc.CUDNN_BATCHNORM_SPATIAL_PERSISTENT, False, NHWC)
    assert len(two) == 2


def test_dropout_states():
    x = cupy.asarray(np.abs(host((256, 1024), 13)) + 1, dtype="float32")
    a, b = cc.DropoutStates(None, 5), cc.DropoutStates(None, 5)
    reserve, y = a.forward(None, x, 0.4)
    assert isinstance(y, cupy.ndarray) and y.shape == x.shape
    yh = cupy.asnumpy(y)
    dropped = yh == 0
    assert abs(dropped.mean() - 0.4) < 0.01
    assert np.allclose(yh[~dropped], cupy.asnumpy(x)[~dropped] / 0.6, rtol=1e-6)
    _, y_b = b.forward(None, x, 0.4)
    assert cupy.array_equal(y, y_b)  # same seed, same mask
    dy = cupy.asarray(host((256, 1024), 14).astype("float32"))
    dx = a.backward(None, dy, 0.4, reserve)
    assert np.allclose(cupy.asnumpy(dx), np.where(dropped, 0, cupy.asnumpy(dy) / 0.6), rtol=1e-6)
    a.set_dropout_ratio(0.1)
    _, y2 = a.forward(None, x, 0.1)
    assert abs((cupy.asnumpy(y2) == 0).mean() - 0.1) < 0.01


@pytest.mark.parametrize("x_dtype,gamma_dtype,expected", [
    ("float32", "float16", "float32"),  # gamma converted: the result in x's dtype
    ("float64", "float32", "float64"),
    ("float16", "float32", "float32"),  # gamma in cuDNN's parameter dtype: kept
])
def test_backward_parameter_gradients_take_cupy13s_dtype(x_dtype, gamma_dtype, expected):
    x = cupy.asarray(host((4, 8, 3, 3), 15).astype(x_dtype))
    g = cupy.ones(8, gamma_dtype)
    pdt = "float64" if x_dtype == "float64" else "float32"
    mean, inv_std = x.astype(pdt).mean(axis=(0, 2, 3)), cupy.ones(8, pdt)
    gy = cupy.ones_like(x)
    _, gg, gb = cc.batch_normalization_backward(x, g, gy, mean, inv_std, 1e-5, True,
                                                cc.CUDNN_BATCHNORM_SPATIAL, False)
    assert gg.dtype == expected and gb.dtype == expected and gg.shape == (8,)
    close(gb, np.full(8, 4 * 3 * 3.0), "float16" if "float16" in (x_dtype, expected) else "float32",
          "gbeta")
