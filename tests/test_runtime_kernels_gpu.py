"""The operations on cuDNN's runtime-compiled pointwise kernels (pycudnn.ops.runtime_kernels), on
a GPU, against the float64 references of test_ops_gpu.py and reference_bn.py: every activation
mode x float32/float16/bfloat16 x NCHW/channels-last, forward and backward, batch-norm inference
channels-last; NaN propagation, in place, unaligned views (which run the legacy kernel), the
background build and the switch-over it makes."""

from __future__ import annotations

import numpy as np
import pytest

import reference_bn as RB
import test_ops_gpu as R

pytestmark = pytest.mark.gpu

import pycudnn  # noqa: E402
from pycudnn.ops import activation_modes  # noqa: E402
from pycudnn.ops import runtime_kernels as rk  # noqa: E402
from pycudnn.ops.activation import activation_backward, activation_forward  # noqa: E402
from pycudnn.ops.batchnorm import batch_norm_forward_inference  # noqa: E402
from pycudnn.runtime.handle import get_handle  # noqa: E402

ACT = [("relu", 0.0), ("sigmoid", 0.0), ("tanh", 0.0), ("clipped_relu", 1.5), ("elu", 0.5),
       ("swish", 2.0)]
DTYPES = ["float32", "float16", "bfloat16"]
# the compiled kernels' float32 tanh/sigmoid/exp are faster approximations than the legacy
# kernels' (measured: tanh backward 1.3e-5 relative); half precision rounds more than either
TOL = {**R.TOL, "float32": 3e-5}
_shapes = iter(range(10_000))


def fresh_shape():
    """A shape no other test uses, so its call signature starts counting from zero."""
    return (2, 8, 5, 6 + next(_shapes))


@pytest.fixture(autouse=True)
def small_tensors_too():
    """The tests' tensors are small: let them have compiled kernels too."""
    rk.configure(min_bytes=0)
    yield
    rk.configure(after_calls=3, background=True, enabled=True, min_bytes=rk.MIN_BYTES)


@pytest.fixture
def compile_at_first_call():
    """Build the compiled kernel inside a signature's first call (then the second call runs it)."""
    rk.configure(after_calls=1, background=False)


def close(actual, expected, dtype, what):
    expected = np.asarray(expected, np.float64)
    scale = max(float(np.abs(expected).max()), 1.0)
    err = float(np.abs(np.asarray(actual, np.float64) - expected).max()) / scale
    assert err <= TOL[dtype], f"{what}: relative error {err:.2e} > {TOL[dtype]:.0e}"


def ready_after(fn):
    """Run ``fn`` and assert it made exactly one compiled kernel ready."""
    before = rk.stats()
    out = fn()
    after = rk.stats()
    assert after["ready"] == before["ready"] + 1, (before, after)
    assert after["failed"] == before["failed"], (before, after)
    return out


@pytest.mark.parametrize("mode,coef", ACT, ids=[f"{m}-{c}" for m, c in ACT])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_activation_on_the_compiled_kernel(compile_at_first_call, mode, coef, dtype, layout):
    shape = fresh_shape()
    rng = np.random.default_rng(0)
    x = R.rounded(rng.uniform(-3, 3, shape), dtype)
    x[np.abs(x) < 2e-2] = 0.5  # away from the kinks of relu and clipped_relu
    x[np.abs(x - 1.5) < 2e-2] = 0.7
    dy = R.rounded(rng.standard_normal(shape), dtype)
    X, DY = R.device(x, dtype, layout), R.device(dy, dtype, layout)
    first = ready_after(lambda: activation_forward(X, mode, coef=coef))  # legacy, then the build
    Y = activation_forward(X, mode, coef=coef)  # the compiled kernel
    R.close(R.host(first), R.act_ref(x, mode, coef), dtype, "forward, legacy kernel")
    close(R.host(Y), R.act_ref(x, mode, coef), dtype, "forward, compiled kernel")
    if layout == "nhwc":
        assert Y.memory_format == "channels_last"
    if mode in ("relu", "clipped_relu") or (mode == "elu" and coef != 1.0):  # legacy kernel
        before = rk.stats()
        activation_backward(Y, DY, X, mode, coef=coef)
        assert rk.stats() == before
    elif activation_modes.row(mode).pytorch_backward:
        # PyTorch's formula runs as a graph kernel from the first call: no build to count
        before = rk.stats()
        first_dx = activation_backward(Y, DY, X, mode, coef=coef)
        assert rk.stats() == before
        close(R.host(first_dx), R.act_grad_ref(x, dy, mode, coef), dtype, "backward, first call")
    else:
        ready_after(lambda: activation_backward(Y, DY, X, mode, coef=coef))
    DX = activation_backward(Y, DY, X, mode, coef=coef)
    close(R.host(DX), R.act_grad_ref(x, dy, mode, coef), dtype, "backward, compiled kernel")


@pytest.mark.parametrize("mode,coef", [("relu", 0.0), ("clipped_relu", 6.0), ("elu", 0.5),
                                       ("elu", 1.0)])
def test_gradients_at_the_kinks_do_not_change_when_a_signature_switches(mode, coef):
    """At x == 0 and x == coef cuDNN's legacy and compiled kernels take different one-sided
    derivatives for clipped relu and elu: a signature gives the same gradient on every call."""
    rk.configure(after_calls=2, background=False)
    x = np.tile(np.array([-1.0, 0.0, 3.0, coef or 5.0, 7.0], np.float32), 2 * 8 * 5 * 8)
    x = x.reshape(2, 8, 5, 40)
    X = pycudnn.from_numpy(x, memory_format="channels_last")
    DY = pycudnn.from_numpy(np.ones_like(x), memory_format="channels_last")
    Y = activation_forward(X, mode, coef=coef)
    grads = [R.host(activation_backward(Y, DY, X, mode, coef=coef)) for _ in range(4)]
    kinks = (x == 0) | (x == coef)
    for g in grads[1:]:
        assert np.array_equal(g[kinks], grads[0][kinks])  # exactly: a one-sided derivative
        close(g, grads[0], "float32", "away from the kinks")  # the kernels round alike
    if mode == "relu":  # PyTorch's convention: no gradient at 0
        assert (grads[0][x == 0] == 0).all()


def test_nan_propagates_and_in_place_on_the_compiled_kernel(compile_at_first_call):
    shape = fresh_shape()
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    x.flat[::7] = np.nan
    X = pycudnn.from_numpy(x)
    ready_after(lambda: activation_forward(X, "relu"))
    y = R.host(activation_forward(X, "relu"))
    assert np.isnan(y.flat[::7]).all()
    assert np.array_equal(np.isnan(y), np.isnan(x))
    assert activation_forward(X, "relu", out=X) is X  # in place: another signature (out=)
    assert activation_forward(X, "relu", out=X) is X
    h = R.host(X)
    assert np.array_equal(np.isnan(h), np.isnan(x))
    assert (h[~np.isnan(h)] >= 0).all()
    R.close(np.nan_to_num(h), np.nan_to_num(np.maximum(x, 0)), "float32", "in place")


def test_unaligned_views_run_the_legacy_kernel_correctly(compile_at_first_call):
    shape = fresh_shape()
    n = int(np.prod(shape))
    base = pycudnn.from_numpy(np.random.default_rng(4).standard_normal(n + 1).astype(np.float32))
    aligned = pycudnn.tensor_from_pointer(base.ptr, shape, "float32", owner=base)
    shifted = pycudnn.tensor_from_pointer(base.ptr + 4, shape, "float32", owner=base)
    ready_after(lambda: activation_forward(aligned, "tanh"))
    got = R.host(activation_forward(shifted, "tanh"))  # same signature, address 4 bytes off
    R.close(got, np.tanh(base.numpy()[1:].astype(np.float64).reshape(shape)), "float32", "shifted")


def test_background_build_switches_a_repeated_signature():
    rk.configure(after_calls=2, background=True)
    try:
        shape = fresh_shape()
        x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
        X = pycudnn.from_numpy(x, memory_format="channels_last")
        before = rk.stats()["ready"]
        for _ in range(3):  # the second asks for the build; none waits for it
            R.close(R.host(activation_forward(X, "sigmoid")), R.sigmoid(x.astype(np.float64)),
                    "float32", "while building")
        assert rk.wait(timeout=60)
        assert rk.stats()["ready"] == before + 1 and rk.stats()["building"] == 0
        close(R.host(activation_forward(X, "sigmoid")), R.sigmoid(x.astype(np.float64)),
              "float32", "compiled")
    finally:
        rk.configure(after_calls=3)


def test_a_build_during_another_threads_global_capture_leaves_both_intact():
    """The build loads a module while this thread captures a CUDA graph in global mode (PyTorch's
    default): the capture must stay valid and the build must succeed."""
    torch = pytest.importorskip("torch")
    rk.configure(after_calls=1, background=True)
    try:
        shape = fresh_shape()
        x = np.random.default_rng(9).standard_normal(shape).astype(np.float32)
        X = pycudnn.from_numpy(x, memory_format="channels_last")
        promotion = rk.activation_promotion("tanh", 0.0, X, (X.strides,), False, True)
        assert promotion is not None
        a = torch.arange(64, device="cuda", dtype=torch.float32)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            b = a * 2  # warm-up outside the capture, as PyTorch's recipe does
        torch.cuda.current_stream().wait_stream(side)
        before = rk.stats()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="global"):
            b = a * 3
            promotion.tick()  # asks the worker for the build; it runs during the capture
            assert rk.wait(timeout=120)
        a += 1
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(b, a * 3)
        assert promotion.plan is not None, promotion.error
        assert rk.stats()["ready"] == before["ready"] + 1
        Y = pycudnn.empty(shape, "float32", memory_format="channels_last")
        assert promotion.launch(get_handle(X.device), (X.ptr, Y.ptr))
        close(R.host(Y), np.tanh(x.astype(np.float64)), "float32", "built during a capture")
    finally:
        rk.configure(after_calls=3)


def test_an_inline_build_inside_this_threads_own_capture_leaves_it_intact():
    """background=False: the build runs in the calling thread, here while that thread captures a
    CUDA graph in global mode; the capture must stay valid and replay the legacy launch."""
    torch = pytest.importorskip("torch")
    rk.configure(after_calls=1, background=False)
    try:
        shape = fresh_shape()
        x = np.random.default_rng(11).standard_normal(shape).astype(np.float32)
        X = pycudnn.from_numpy(x, memory_format="channels_last")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        before = rk.stats()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side, capture_error_mode="global"):
            Y = activation_forward(X, "tanh", stream=side.cuda_stream)  # legacy, then the build
        assert rk.stats()["ready"] == before["ready"] + 1
        graph.replay()
        torch.cuda.synchronize()
        close(R.host(Y), np.tanh(x.astype(np.float64)), "float32", "replayed")
        close(R.host(activation_forward(X, "tanh")), np.tanh(x.astype(np.float64)), "float32",
              "compiled, after the capture")
    finally:
        rk.configure(after_calls=3, background=True)


def test_disabled_builds_nothing(compile_at_first_call):
    rk.configure(enabled=False)
    shape = fresh_shape()
    X = pycudnn.from_numpy(np.ones(shape, np.float32))
    before = rk.stats()
    for _ in range(3):
        activation_forward(X, "relu")
    assert rk.stats() == before


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_inference_on_the_compiled_kernel(compile_at_first_call, dtype):
    torch = pytest.importorskip("torch")
    shape = fresh_shape()
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5).to(
        "cuda", getattr(torch, dtype)).to(memory_format=torch.channels_last)
    c = shape[1]
    w, b, rm = (torch.randn(c, generator=g, dtype=torch.float64).cuda().float() for _ in range(3))
    rv = (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).cuda().float()
    batch_norm_forward_inference(x, w, b, rm, rv, eps=1e-3)  # the full checks store the plan
    ready_after(lambda: batch_norm_forward_inference(x, w, b, rm, rv, eps=1e-3))
    y = batch_norm_forward_inference(x, w, b, rm, rv, eps=1e-3)
    assert y.memory_format == "channels_last"
    f64 = lambda t: t.double().cpu().numpy()  # noqa: E731
    ref = RB.forward_inference(f64(x), f64(w), f64(b), f64(rm), f64(rv), 1e-3, "spatial")
    got = y.numpy().astype(np.float64)
    scale = max(np.abs(ref).max(), 1e-3)
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    assert np.abs(got - ref).max() / scale <= tol
