"""pycudnn.cupy_compat's activation, softmax and pooling on CuPy arrays against the float64 NumPy
references of test_ops_gpu.py: CuPy 13's layouts (softmax along any axis, pooling into a
preallocated C-contiguous y), return values (new CuPy arrays; pooling_forward returns y) and
CuPy's current stream."""

from __future__ import annotations

import itertools

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


def _cover_all_windows(shape, k, s, p):
    """Chainer's cover_all=True windows: one more per dim where the floor size leaves input out."""
    out = [(i + 2 * pi - ki + si - 1) // si + 1 for i, ki, si, pi in zip(shape, k, s, p)]
    for o in itertools.product(*map(range, out)):
        ranges = [range(oi * si - pi, oi * si - pi + ki) for oi, si, pi, ki in zip(o, s, p, k)]
        yield o, [q for q in itertools.product(*ranges)
                  if all(0 <= qi < n for qi, n in zip(q, shape))]


@pytest.mark.parametrize("mode", [cc.CUDNN_POOLING_MAX, cc.CUDNN_POOLING_MAX_DETERMINISTIC])
@pytest.mark.parametrize("dtype", DTYPES)
def test_max_pooling_into_chainers_cover_all_size(mode, dtype):
    """Chainer's max_pooling_2d (cover_all=True by default) preallocates y one window larger
    where the floor size leaves input out; CuPy 13 passed it to cuDNN as given."""
    shape, k, s, p = (2, 3, 8, 8), (3, 3), (2, 2), (1, 1)
    x = R.distinct(shape, 7)
    windows = list(_cover_all_windows(shape[2:], k, s, p))
    y_ref = np.zeros((2, 3, 5, 5))  # the floor size would be 4 x 4
    gy = R.rounded(np.random.default_rng(8).standard_normal(y_ref.shape), dtype)
    gx_ref = np.zeros(shape)
    for o, inside in windows:
        vals = np.stack([x[(slice(None), slice(None)) + q] for q in inside], axis=-1)
        y_ref[(slice(None), slice(None)) + o] = vals.max(axis=-1)
        arg = vals.argmax(axis=-1)
        for j, q in enumerate(inside):
            gx_ref[(slice(None), slice(None)) + q] += np.where(
                arg == j, gy[(slice(None), slice(None)) + o], 0.0)
    xd = dev(x, dtype)
    y = cupy.full(y_ref.shape, np.nan, dtype)
    assert cc.pooling_forward(xd, y, k, s, p, mode) is y
    check(y, y_ref, dtype, "forward")
    check(cc.pooling_backward(xd, y, dev(gy, dtype), k, s, p, mode), gx_ref, dtype, "backward")
    with pytest.raises(ValueError, match=r"\[2, 3, 4, 4\] \(or \[2, 3, 5, 5\], Chainer's cover_all"):
        cc.pooling_forward(xd, cupy.empty((2, 3, 6, 6), dtype), k, s, p, mode)


def test_broadcast_inputs_are_read_like_contiguous_ones():
    """cupy.broadcast_to views (stride-0 dims), e.g. the gradient of a sum: CuPy 13 copied its
    inputs to contiguous arrays, so every function takes them."""
    rng = np.random.default_rng(9)
    row = cupy.asarray(rng.standard_normal((1, 3, 1, 5)).astype(np.float32))
    b = cupy.broadcast_to(row, (2, 3, 4, 5))
    dense = cupy.ascontiguousarray(b)
    assert 0 in b.strides
    x = cupy.asarray(rng.standard_normal((2, 3, 4, 5)).astype(np.float32))
    relu = cc.CUDNN_ACTIVATION_RELU
    y = cc.activation_forward(x, relu)
    assert cupy.array_equal(cc.activation_backward(x, y, b, relu),
                            cc.activation_backward(x, y, dense, relu))
    assert cupy.array_equal(cc.activation_forward(b, relu), cc.activation_forward(dense, relu))
    assert cupy.array_equal(cc.softmax_forward(b, 1, cc.CUDNN_SOFTMAX_ACCURATE),
                            cc.softmax_forward(dense, 1, cc.CUDNN_SOFTMAX_ACCURATE))
    pooled = [cupy.empty((2, 3, 2, 2), cupy.float32) for _ in range(2)]
    for src, out in zip((b, dense), pooled):
        cc.pooling_forward(src, out, (2, 2), (2, 2), (0, 0), cc.CUDNN_POOLING_MAX)
    assert cupy.array_equal(*pooled)
    w = cupy.asarray(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    convs = [cupy.empty((2, 4, 2, 3), cupy.float32) for _ in range(2)]
    for src, out in zip((b, dense), convs):
        cc.convolution_forward(src, w, None, out, (0, 0), (1, 1), (1, 1), 1, auto_tune=False,
                               tensor_core="never")
    assert cupy.array_equal(*convs)
    gamma = cupy.broadcast_to(cupy.asarray(np.float32(2.0)), (3,))
    zeros, ones = cupy.zeros(3, cupy.float32), cupy.ones(3, cupy.float32)
    bn = [cc.batch_normalization_forward_inference(b, g, zeros, zeros, ones, 1e-5, True,
                                                   cc.CUDNN_BATCHNORM_SPATIAL)
          for g in (gamma, cupy.full(3, 2.0, cupy.float32))]
    assert cupy.array_equal(*bn)
    states = cc.DropoutStates(None, 3)
    reserve, _ = states.forward(None, x, 0.5)
    assert cupy.array_equal(states.backward(None, b, 0.5, reserve),
                            states.backward(None, dense, 0.5, reserve))


def test_numpy_scalars_are_taken_as_cupy13_took_them():
    x = cupy.asarray(np.random.default_rng(10).standard_normal((2, 3, 4, 5)).astype(np.float32))
    assert cupy.array_equal(cc.activation_forward(x, np.int64(cc.CUDNN_ACTIVATION_RELU)),
                            cc.activation_forward(x, cc.CUDNN_ACTIVATION_RELU))
    assert cupy.array_equal(cc.softmax_forward(x, np.int64(1), np.int32(cc.CUDNN_SOFTMAX_LOG)),
                            cc.softmax_forward(x, 1, cc.CUDNN_SOFTMAX_LOG))
    rm, rv = cupy.zeros(3, cupy.float32), cupy.ones(3, cupy.float32)
    cc.batch_normalization_forward_training(
        x, cupy.ones(3, cupy.float32), cupy.zeros(3, cupy.float32), rm, rv, None, None, 1e-5,
        np.float32(0.5), True, np.int64(cc.CUDNN_BATCHNORM_SPATIAL), False)
    mean = cupy.asnumpy(x).astype(np.float64).mean(axis=(0, 2, 3))
    R.close(cupy.asnumpy(rm), 0.5 * mean, "float32", "running mean, decay 0.5")
