"""GPU tests of the hot path: remembered call signatures and PreparedConvolution objects."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import reference as R

pytestmark = pytest.mark.gpu

ENGINES = ["graph", "v7"]


@pytest.fixture(autouse=True)
def _fresh():
    import pycudnn

    pycudnn.clear_caches()
    yield
    pycudnn.clear_caches()


def _data(seed, shape=(2, 8, 10, 10), k=8):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape).astype(np.float32),
            rng.standard_normal((k, shape[1], 3, 3)).astype(np.float32))


def _err(got, ref):
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("engine", ENGINES)
def test_repeated_calls_take_the_remembered_path_and_stay_right(engine):
    import pycudnn
    from pycudnn import prepared

    x, w = _data(0)
    X, W = pycudnn.from_numpy(x), pycudnn.from_numpy(w)
    for i in range(5):
        x2 = x * (i + 1)
        X = pycudnn.from_numpy(x2)
        y = pycudnn.convolution(X, W, padding=1, engine=engine, allow_tf32=False)
        assert _err(y.numpy(), R.conv_forward(x2, w, (1, 1), (1, 1), (1, 1), 1)) < 2e-5
    assert len(prepared._fast) == 1
    # another flag is another signature
    pycudnn.convolution(X, W, padding=1, engine=engine, allow_tf32=True)
    assert len(prepared._fast) == 2
    with pycudnn.flags(deterministic=True):
        pycudnn.convolution(X, W, padding=1, engine=engine, allow_tf32=False)
    assert len(prepared._fast) == 3
    pycudnn.clear_caches()
    assert len(prepared._fast) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_geometry_given_as_lists_runs_and_is_not_remembered(engine):
    import pycudnn
    from pycudnn import prepared

    x, w = _data(4)
    X, W = pycudnn.from_numpy(x), pycudnn.from_numpy(w)
    ref = R.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1)
    for _ in range(2):  # lists cannot key the remembered calls: the full path each time
        y = pycudnn.convolution(X, W, stride=[1, 1], padding=[1, 1], dilation=[1, 1],
                                activation="relu", engine=engine, allow_tf32=False)
        assert _err(y.numpy(), np.maximum(ref, 0)) < 2e-5
    assert len(prepared._fast) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_prepared_object_all_directions(engine):
    import pycudnn

    x, w = _data(1)
    X, W = pycudnn.from_numpy(x), pycudnn.from_numpy(w)
    geom = dict(stride=1, padding=1, engine=engine, allow_tf32=False)
    fwd = pycudnn.prepare_convolution(X, W, **geom)
    assert isinstance(fwd, pycudnn.PreparedConvolution)
    out = pycudnn.empty((2, 8, 10, 10), "float32")
    for i in range(3):
        xi = x + i
        y = fwd(pycudnn.from_numpy(xi), W, out=out)
        assert y is out
        assert _err(out.numpy(), R.conv_forward(xi, w, (1, 1), (1, 1), (1, 1), 1)) < 2e-5
    dy = np.random.default_rng(2).standard_normal((2, 8, 10, 10)).astype(np.float32)
    DY = pycudnn.from_numpy(dy)
    bwd = pycudnn.prepare_convolution(DY, W, direction="backward_data", input_shape=x.shape, **geom)
    assert _err(bwd(DY, W).numpy(), R.conv_backward_data(dy, w, x.shape, (1, 1), (1, 1), (1, 1), 1)) < 2e-5
    wgt = pycudnn.prepare_convolution(X, DY, direction="backward_filter", weight_shape=w.shape, **geom)
    assert _err(wgt(X, DY).numpy(), R.conv_backward_filter(x, dy, w.shape, (1, 1), (1, 1), (1, 1), 1)) < 5e-5


def test_prepared_refuses_other_shapes_and_outputs():
    import pycudnn

    x, w = _data(3)
    X, W = pycudnn.from_numpy(x), pycudnn.from_numpy(w)
    conv = pycudnn.prepare_convolution(X, W, padding=1)
    with pytest.raises(ValueError, match="prepared convolution: expected inputs of shapes"):
        conv(pycudnn.from_numpy(np.zeros((3, 8, 10, 10), np.float32)), W)
    with pytest.raises(ValueError, match="out must have shape"):
        conv(X, W, out=pycudnn.empty((2, 8, 9, 9), "float32"))
    with pytest.raises(ValueError, match="dtype float32"):
        conv(pycudnn.from_numpy(x.astype(np.float16)), W)


def test_misaligned_pointers_fall_back_to_the_full_path():
    import pycudnn

    rng = np.random.default_rng(4)
    big = rng.standard_normal((3, 8, 10, 10)).astype(np.float16)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float16)
    B, W = pycudnn.from_numpy(big), pycudnn.from_numpy(w)
    aligned = B.narrow(0, 0, 2)
    pycudnn.convolution(aligned, W, padding=1, engine="graph")  # remembered with 16-byte pointers
    # a view starting 2 bytes in: same shape and strides, pointer only 2-byte aligned
    odd = pycudnn.tensor_from_pointer(B.ptr + 2, (2, 8, 10, 10), "float16", device=B.device, owner=B)
    y = pycudnn.convolution(odd, W, padding=1, engine="graph")
    host = big.reshape(-1)[1:1 + 2 * 800].reshape(2, 8, 10, 10).astype(np.float64)
    assert _err(y.numpy(), R.conv_forward(host, w.astype(np.float64), (1, 1), (1, 1), (1, 1), 1)) < 1e-2


def test_fused_bias_relu_and_add_relu_prepared():
    import pycudnn

    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 16, 8, 8)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    z = rng.standard_normal((4, 16, 8, 8)).astype(np.float32)
    kw = dict(dtype="bfloat16", memory_format="channels_last")
    bf = lambda a: pycudnn.from_numpy(a, **kw)  # noqa: E731
    X, W, Z = bf(x), bf(w), bf(z)
    Bv = pycudnn.from_numpy(b, dtype="bfloat16")
    xr, wr, zr, br = (np.asarray(t.numpy(), np.float64) for t in (X, W, Z, Bv))
    conv = R.conv_forward(xr, wr, (1, 1), (1, 1), (1, 1), 1)
    for _ in range(3):
        y = pycudnn.convolution(X, W, Bv, padding=1, activation="relu")
        assert _err(y.numpy(), np.maximum(conv + br[None, :, None, None], 0)) < 3e-2
        y2 = pycudnn.convolution_add_relu(X, W, Z, alpha=0.5, padding=1)
        assert _err(y2.numpy(), np.maximum(conv + 0.5 * zr, 0)) < 3e-2
        y3 = pycudnn.convolution_add_relu(X, W, Z, alpha=1.0, bias=Bv, padding=1)
        assert _err(y3.numpy(), np.maximum(conv + zr + br[None, :, None, None], 0)) < 3e-2
    fused = [e for e in pycudnn.benchmark_cache() if e["fused"]]
    assert fused, "the graph engine should have fused these epilogues on an H200"


def test_prepared_from_many_threads():
    import pycudnn
    from cuda.core import Device

    x, w = _data(6, shape=(4, 16, 12, 12), k=16)
    X, W = pycudnn.from_numpy(x), pycudnn.from_numpy(w)
    conv = pycudnn.prepare_convolution(X, W, padding=1, deterministic=True)
    expect = conv(X, W).numpy()
    errors = []

    def worker():
        try:
            dev = Device(0)
            dev.set_current()
            s = dev.create_stream()
            for _ in range(50):
                y = conv(X, W, stream=s)
                s.sync()
                if not np.array_equal(y.numpy(), expect):
                    errors.append("mismatch")
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
