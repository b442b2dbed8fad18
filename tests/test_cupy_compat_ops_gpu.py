"""pycudnn.cupy_compat's activation, softmax and pooling on CuPy arrays against the float64 NumPy
references of test_ops_gpu.py: CuPy 13's layouts (softmax along any axis, pooling into a
preallocated C-contiguous y), return values (new CuPy arrays; pooling_forward returns y) and
CuPy's current stream."""

from __future__ import annotations

import numpy as np
import pytest

import test_ops_gpu as R

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")

from pycudnn import cupy_compat as cc  # noqa: E402

DTYPES = ["float32", "float64", "float16"]  # CuPy has no bfloat16
ACT = {cc.CUDNN_ACTIVATION_SIGMOID: ("sigmoid", 0.0), cc.CUDNN_ACTIVATION_RELU: ("relu", 0.0),
       cc.CUDNN_ACTIVATION_TANH: ("tanh", 0.0), cc.CUDNN_ACTIVATION_CLIPPED_RELU: ("clipped_relu", 1.5),
       cc.CUDNN_ACTIVATION_ELU: ("elu", 1.0), cc.CUDNN_ACTIVATION_SWISH: ("swish", 1.0)}


def dev(a, dtype):
    return cupy.asarray(np.asarray(a).astype(dtype))


def check(result, expected, dtype, what=""):
    assert isinstance(result, cupy.ndarray), type(result)
    assert result.flags.c_contiguous and result.dtype == np.dtype(dtype)
    R.close(cupy.asnumpy(result).astype(np.float64), expected, dtype, what)


@pytest.mark.parametrize("mode", sorted(ACT))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (7,), (2, 3, 2, 2, 2, 2)], ids=["4d", "1d", "6d"])
def test_activation(mode, dtype, shape):
    name, coef = ACT[mode]
    rng = np.random.default_rng(0)
    x = R.rounded(rng.uniform(-3, 3, shape), dtype)
    x[np.abs(x) < 2e-2] = 0.5
    x[np.abs(x - 1.5) < 2e-2] = 0.7
    gy = R.rounded(rng.standard_normal(shape), dtype)
    xd = dev(x, dtype)
    y = cc.activation_forward(xd, mode, coef)
    check(y, R.act_ref(x, name, coef), dtype, "forward")
    assert y.shape == shape
    gx = cc.activation_backward(xd, y, dev(gy, dtype), mode, coef)
    check(gx, R.act_grad_ref(x, gy, name, coef), dtype, "backward")


def test_activation_takes_non_contiguous_input():
    x = np.random.default_rng(1).standard_normal((4, 6, 5)).astype(np.float32)
    xd = cupy.asarray(x)[:, ::2, :]
    y = cc.activation_forward(xd, cc.CUDNN_ACTIVATION_TANH)
    check(y, np.tanh(x[:, ::2, :].astype(np.float64)), "float32")


@pytest.mark.parametrize("algorithm", [cc.CUDNN_SOFTMAX_FAST, cc.CUDNN_SOFTMAX_ACCURATE,
                                       cc.CUDNN_SOFTMAX_LOG])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", [((3, 5, 4, 2), 1), ((3, 5, 4, 2), -1), ((3, 5, 4, 2), 0),
                                        ((6, 10), 1), ((10,), 0), ((3, 5, 1), 2)])
def test_softmax_along_axis(algorithm, dtype, shape, axis):
    name = {0: "fast", 1: "accurate", 2: "log"}[algorithm]
    rng = np.random.default_rng(2)
    x = R.rounded(rng.uniform(-4, 4, shape), dtype)
    # the reference: softmax along `axis` (move it to dim 1 of a (left, axis, right) view)
    a = axis % len(shape)
    left, right = int(np.prod(shape[:a])), int(np.prod(shape[a + 1:]))
    x3 = x.reshape(left, shape[a], right)
    y_ref = R.softmax_ref(x3, name, "channel").reshape(shape)
    y = cc.softmax_forward(dev(x, dtype), axis, algorithm)
    check(y, y_ref, dtype, "forward")
    gy = R.rounded(rng.standard_normal(shape), dtype)
    y_in = R.rounded(y_ref, dtype)
    gx_ref = R.softmax_grad_ref(y_in.reshape(left, shape[a], right),
                                gy.reshape(left, shape[a], right), name, "channel").reshape(shape)
    gx = cc.softmax_backward(dev(y_in, dtype), dev(gy, dtype), axis, algorithm)
    check(gx, gx_ref, dtype, "backward")


def test_softmax_of_a_transposed_array():
    x = np.random.default_rng(3).standard_normal((4, 5, 6))
    xd = cupy.asarray(x).transpose(2, 0, 1)  # not mergeable around the axis: copied first
    y = cc.softmax_forward(xd, 1, cc.CUDNN_SOFTMAX_ACCURATE)
    xt = x.transpose(2, 0, 1)
    check(y, R.softmax_ref(xt, "accurate", "channel"), "float64")


POOL = {cc.CUDNN_POOLING_MAX: "max", cc.CUDNN_POOLING_MAX_DETERMINISTIC: "max_deterministic",
        cc.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING: "average_include_padding",
        cc.CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING: "average_exclude_padding"}


@pytest.mark.parametrize("mode", sorted(POOL))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geometry", R.GEOMETRIES + [((2, 3, 8, 8), (3, 3), (1, 1), (2, 2))],
                         ids=R.GEO_IDS + ["pad2-cupy-rule"])
def test_pooling(mode, dtype, geometry):
    shape, k, s, p = geometry
    name = POOL[mode]
    x = R.distinct(shape, 4)
    y_ref = R.pool_ref(x, k, s, p, name)
    xd = dev(x, dtype)
    y = cupy.full(y_ref.shape, np.nan, dtype)
    assert cc.pooling_forward(xd, y, k, s, p, mode) is y  # CuPy 13 returned the y it was given
    check(y, y_ref, dtype, "forward")
    gy = R.rounded(np.random.default_rng(5).standard_normal(y_ref.shape), dtype)
    gx = cc.pooling_backward(xd, y, dev(gy, dtype), k, s, p, mode)
    assert gx.shape == shape
    check(gx, R.pool_grad_ref(x, gy, k, s, p, name), dtype, "backward")


def test_nan_does_not_propagate_like_cupy13():
    x = cupy.asarray(np.array([[[[np.nan, 1.0], [-1.0, 2.0]]]], np.float32))
    y = cupy.asnumpy(cc.activation_forward(x, cc.CUDNN_ACTIVATION_RELU))
    assert not np.isnan(y[0, 0, 0, 1:]).any()
    yp = cupy.empty((1, 1, 1, 1), cupy.float32)
    cc.pooling_forward(x, yp, (2, 2), (2, 2), (0, 0), cc.CUDNN_POOLING_MAX)
    assert float(yp[0, 0, 0, 0]) == 2.0  # NaN skipped (CUDNN_NOT_PROPAGATE_NAN)


def test_runs_on_cupys_current_stream():
    x = np.random.default_rng(6).standard_normal((16, 32, 16, 16)).astype(np.float32)
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        xd = cupy.asarray(x)
        y = cc.activation_forward(xd, cc.CUDNN_ACTIVATION_SIGMOID)
        yp = cupy.empty((16, 32, 8, 8), cupy.float32)
        cc.pooling_forward(y, yp, (2, 2), (2, 2), (0, 0), cc.CUDNN_POOLING_MAX)
        got = cupy.asnumpy(yp, stream=side)
        side.synchronize()
    R.close(got, R.pool_ref(R.sigmoid(x.astype(np.float64)), (2, 2), (2, 2), (0, 0), "max"),
            "float32")
