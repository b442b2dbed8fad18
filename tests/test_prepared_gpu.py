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
    from pycudnn.api import prepared

    x, w = _data(0)
    X, W = pycudnn.from_numpy(x), pycudnn.from_numpy(w)
    for i in range(5):
        x2 = x * (i + 1)
        X = pycudnn.from_numpy(x2)
        y = pycudnn.convolution(X, W, padding=1, engine=engine, allow_tf32=False)
        assert _err(y.numpy(), R.conv_forward(x2, w, (1, 1), (1, 1), (1, 1), 1)) < 2e-5
    assert len(prepared.remembered_calls()) == 1
    # another flag is another signature
    pycudnn.convolution(X, W, padding=1, engine=engine, allow_tf32=True)
    assert len(prepared.remembered_calls()) == 2
    with pycudnn.flags(deterministic=True):
        pycudnn.convolution(X, W, padding=1, engine=engine, allow_tf32=False)
    assert len(prepared.remembered_calls()) == 3
    pycudnn.clear_caches()
    assert len(prepared.remembered_calls()) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_geometry_given_as_lists_is_remembered_as_its_tuples(engine):
    import pycudnn
    from pycudnn.api import prepared

    x, w = _data(4)
    X, W = pycudnn.from_numpy(x), pycudnn.from_numpy(w)
    ref = R.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1)
    as_lists = dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1])
    as_tuples = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1))
    for geometry in (as_lists, as_lists, as_tuples):
        y = pycudnn.convolution(X, W, **geometry, engine=engine, allow_tf32=False)
        assert _err(y.numpy(), ref) < 2e-5
        assert len(prepared.remembered_calls()) == 1  # one signature: lists key as tuples
    # a list is read when the call is made: changing it afterwards changes nothing remembered
    stride = [1, 1]
    pycudnn.convolution(X, W, stride=stride, padding=[1, 1], dilation=[1, 1], engine=engine,
                        allow_tf32=False)
    stride[0] = 2
    y = pycudnn.convolution(X, W, stride=stride, padding=[1, 1], dilation=[1, 1],
                            engine=engine, allow_tf32=False)
    assert y.shape == (2, 8, 5, 10)
    assert _err(y.numpy(), R.conv_forward(x, w, (2, 1), (1, 1), (1, 1), 1)) < 2e-5
    assert len(prepared.remembered_calls()) == 2


def test_a_dropped_full_path_output_is_kept_and_reused_on_the_legacy_stream():
    """A full-path tensor (empty()) on the legacy stream comes from and goes back to the kept
    blocks, as the hot path's outputs do: no stream-ordered allocation work between kernels."""
    import pycudnn
    from pycudnn.runtime.memory import current_device, empty_cache, pool

    empty_cache()  # no kept blocks from earlier tests: the bound cannot refuse this one
    pycudnn.empty((4096,), "float32")  # the device's pool is prepared by a first allocation
    kept = (current_device(), 4 << 20)
    a = pycudnn.empty((1 << 20,), "float32")
    ptr = a.ptr
    del a
    assert ptr in pool.blocks.get(kept, [])
    b = pycudnn.empty((1 << 20,), "float32")
    assert b.ptr == ptr and ptr not in pool.blocks.get(kept, [])
    c = pycudnn.empty((1 << 20,), "float32", stream=2)  # the per-thread stream: freed in order
    c_ptr = c.ptr
    del c
    assert c_ptr not in pool.blocks.get(kept, [])


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


# ---- the bias and z of fused epilogues -----------------------------------------------------------

BF16_CL = dict(dtype="bfloat16", memory_format="channels_last")  # what the fused engines take


def _bf16(a):
    """``a`` rounded to bfloat16, as float64 (what the device holds, for the references)."""
    import pycudnn

    return np.asarray(pycudnn.from_numpy(np.asarray(a, np.float32), dtype="bfloat16").numpy(), np.float64)


def _fused_seen():
    import pycudnn

    return [e for e in pycudnn.benchmark_cache() if e["fused"]]


def test_made_up_zero_bias_is_complete_for_calls_on_other_streams():
    """convolution_add_relu without a bias on stream S1 (busy) then on S2: the zero bias the
    first call made up was filled on S1, behind its busy work, and the remembered call on S2 read
    it before the fill (the memory had held 1000.0 before: off by about 1000)."""
    import pycudnn
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    s1, s2 = dev.create_stream(), dev.create_stream()
    rng = np.random.default_rng(3)
    xh = rng.standard_normal((1, 16, 8, 8))
    wh = rng.standard_normal((16, 16, 3, 3))
    zh = rng.standard_normal((1, 16, 8, 8))
    x, w, z = (pycudnn.from_numpy(a.astype(np.float32), **BF16_CL) for a in (xh, wh, zh))
    ref = np.maximum(R.conv_forward(_bf16(xh), _bf16(wh), (1, 1), (1, 1), (1, 1), 1) + _bf16(zh), 0)
    f = dict(padding=1, engine="graph", allow_tf32=False)
    bx = pycudnn.from_numpy(rng.standard_normal((32, 256, 96, 96)).astype(np.float32))
    bw = pycudnn.from_numpy(rng.standard_normal((256, 256, 3, 3)).astype(np.float32))
    by = pycudnn.empty((32, 256, 96, 96))
    pycudnn.convolution(bx, bw, out=by, stream=s1, **f)  # searched and remembered
    pycudnn.convolution(bx, bw, out=by, stream=s1, **f)
    s1.sync()
    prime = pycudnn.from_numpy(np.full(32768, 1000.0, np.float32), dtype="bfloat16", stream=s1)
    del prime  # 64 KiB of 1000.0 back to the pool, on S1: what a made-up bias may get next
    for _ in range(40):
        pycudnn.convolution(bx, bw, out=by, stream=s1, **f)  # ~0.1 s queued on S1
    y1 = pycudnn.convolution_add_relu(x, w, z, stream=s1, **f)  # the bias is made up here
    y2 = pycudnn.convolution_add_relu(x, w, z, stream=s2, **f)  # the remembered call, on S2
    s2.sync()
    r2 = y2.numpy(stream=s2)
    s1.sync()
    r1 = y1.numpy(stream=s1)
    assert _fused_seen(), "the graph engine should have fused this epilogue (bfloat16, channels-last): the test needs the fused path"
    assert _err(r1, ref) < 3e-2
    assert _err(r2, ref) < 3e-2


def test_prepared_strided_bias_is_read_as_strided():
    """A bias of stride 2 (every other element of a buffer): the prepared call copies it dense,
    as the full path does, instead of reading the first K elements of the buffer."""
    import pycudnn
    from pycudnn.runtime.tensor import tensor_from_pointer

    rng = np.random.default_rng(2)
    xh = rng.standard_normal((2, 8, 16, 16))
    wh = rng.standard_normal((16, 8, 3, 3))
    bh = rng.standard_normal(32)
    x, w = (pycudnn.from_numpy(a.astype(np.float32), **BF16_CL) for a in (xh, wh))
    buf = pycudnn.from_numpy(bh.astype(np.float32), dtype="bfloat16")
    strided = tensor_from_pointer(buf.ptr, (16,), buf.dtype, strides=(2,), owner=buf)
    dense = pycudnn.from_numpy(bh[::2].astype(np.float32), dtype="bfloat16")
    conv = R.conv_forward(_bf16(xh), _bf16(wh), (1, 1), (1, 1), (1, 1), 1)
    ref = conv + _bf16(bh[::2])[None, :, None, None]
    f = dict(padding=1, engine="graph")
    assert _err(pycudnn.convolution(x, w, strided, **f).numpy(), ref) < 3e-2  # the full path
    prepared = pycudnn.prepare_convolution(x, w, dense, **f)
    assert _fused_seen(), "the graph engine should have fused the bias (bfloat16, channels-last): the test needs the fused path"
    for _ in range(2):
        assert _err(prepared(x, w, bias=strided).numpy(), ref) < 3e-2
        assert _err(prepared(x, w, bias=dense).numpy(), ref) < 3e-2


def test_prepared_refusals_launch_nothing_and_leave_out_untouched():
    import pycudnn
    from pycudnn.api import prepared as P

    rng = np.random.default_rng(7)
    xh = rng.standard_normal((1, 16, 8, 8))
    wh = rng.standard_normal((16, 16, 3, 3))
    zh = rng.standard_normal((1, 16, 8, 8))
    bh = rng.standard_normal(16)
    x, w = (pycudnn.from_numpy(a.astype(np.float32), **BF16_CL) for a in (xh, wh))
    b = pycudnn.from_numpy(bh.astype(np.float32), dtype="bfloat16")
    f = dict(padding=1, engine="graph")
    plain = pycudnn.prepare_convolution(x, w, **f)
    with pytest.raises(ValueError, match="bias was given, but this convolution was prepared without"):
        plain(x, w, bias=b)
    with pytest.raises(ValueError, match="z was given"):
        plain(x, w, z=pycudnn.from_numpy(zh.astype(np.float32), **BF16_CL))
    # a z and an out sharing one buffer, out shifted by one row of z: partly overlapping
    pattern = (np.arange(2 * 16 * 8 * 8) % 7 - 3).reshape(2, 16, 8, 8).astype(np.float32)
    big = pycudnn.from_numpy(pattern, **BF16_CL)  # two samples: room for the shift
    z = pycudnn.tensor_from_pointer(big.ptr, (1, 16, 8, 8), big.dtype, strides=big.strides, owner=big)
    pycudnn.convolution_add_relu(x, w, z, bias=b, **f)  # remembered with z and a dense bias
    fused = [p for p in P.remembered_calls() if p.has_z]
    assert fused, "the graph engine should have fused this epilogue (bfloat16, channels-last): the test needs the fused path"
    conv = fused[0]
    shifted = pycudnn.tensor_from_pointer(big.ptr + 8 * 16 * 2, (1, 16, 8, 8), big.dtype,
                                          strides=big.strides, owner=big)
    before = np.asarray(big.numpy(), np.float64).copy()
    with pytest.raises(ValueError, match="out partially overlaps z"):
        conv(x, w, out=shifted, z=z, bias=b)
    with pytest.raises(ValueError, match="out partially overlaps z"):  # the same call, full path
        pycudnn.convolution_add_relu(x, w, z, bias=b, out=shifted, **f)
    pycudnn.runtime.memory.synchronize()
    assert np.array_equal(np.asarray(big.numpy(), np.float64), before)
    # out is z exactly: allowed (an in-place residual), as on the full path
    zref = np.asarray(z.numpy(), np.float64)
    ref = np.maximum(R.conv_forward(_bf16(xh), _bf16(wh), (1, 1), (1, 1), (1, 1), 1) + zref
                     + _bf16(bh)[None, :, None, None], 0)
    assert conv(x, w, out=z, z=z, bias=b) is z
    assert _err(z.numpy(), ref) < 3e-2


@pytest.mark.parametrize("engine", ENGINES)
def test_torch_out_takes_the_lean_path_and_every_other_out_the_full_checks(engine):
    """A torch out= of the layout accepted before is tested through its remembered torch layout
    (no as_tensor): the results stay right, in the remembered call and in a prepared object; an
    out of another layout, one overlapping the input and one with a negative bit still get the
    full path's answer."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    import pycudnn
    from pycudnn.api import prepared

    torch.manual_seed(0)
    x = torch.randn(2, 8, 10, 10, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    ref = F.conv2d(x.cpu().double(), w.cpu().double(), padding=1).float()
    flags = {"engine": engine, "allow_tf32": False}

    def close(y):
        torch.testing.assert_close(y.cpu(), ref, rtol=1e-4, atol=1e-4)

    for _ in range(3):
        y = torch.full((2, 8, 10, 10), float("nan"), device="cuda")
        got = pycudnn.convolution(x, w, padding=1, **flags, out=y)
        assert got.ptr == y.data_ptr()
        close(y)
    (remembered,) = prepared.remembered_calls()
    assert remembered._torch_out_class is torch.Tensor
    # another layout of the same shape: the full path (a staged copy), the remembered entry kept
    y_cl = torch.full_like(y, float("nan")).to(memory_format=torch.channels_last)
    pycudnn.convolution(x, w, padding=1, **flags, out=y_cl)
    close(y_cl)
    assert prepared.remembered_calls() == [remembered]
    # an out sharing the input's memory and one with a negative bit: refused as before
    with pytest.raises(ValueError, match="overlaps input"):
        pycudnn.convolution(x, w, padding=1, **flags, out=x)
    with pytest.raises(TypeError, match="negative bit"):
        pycudnn.convolution(x, w, padding=1, **flags, out=torch.empty_like(y)._neg_view())
    # a prepared object called with torch tensors and out=, twice (learn, then lean)
    conv = pycudnn.prepare_convolution(x, w, padding=1, **flags)
    for _ in range(2):
        y = torch.full_like(y, float("nan"))
        conv(x, w, out=y)
        close(y)
    assert conv._torch_out_class is torch.Tensor
    with pytest.raises(ValueError, match="out overlaps an input"):
        conv(x, w, out=x)
