"""pycudnn.ops.runtime_kernels without a GPU: the settings' checks, the flat channels-last layout
element-wise work is described in, which signatures can have a compiled kernel, and that a build
that fails (here: no GPU for a cuDNN handle) leaves the signature on the legacy kernel."""

from __future__ import annotations

import math

import numpy as np
import pytest

import pycudnn
from pycudnn.ops import runtime_kernels as rk

ADDR = 1 << 40  # a made-up device address: nothing here dereferences it


@pytest.fixture(autouse=True)
def small_tensors_too():
    rk.configure(min_bytes=0)
    yield
    rk.configure(after_calls=3, background=True, enabled=True, min_bytes=rk.MIN_BYTES)


def view(shape, dtype="float32", strides=None, addr=ADDR):
    return pycudnn.tensor_from_pointer(addr, shape, dtype, strides=strides)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="after_calls must be an int >= 1"):
        rk.configure(after_calls=0)
    with pytest.raises(ValueError, match="after_calls must be an int >= 1"):
        rk.configure(after_calls=True)
    with pytest.raises(TypeError, match="enabled must be a bool"):
        rk.configure(enabled=1)
    with pytest.raises(TypeError, match="background must be a bool"):
        rk.configure(background="yes")
    with pytest.raises(ValueError, match="min_bytes must be an int >= 0"):
        rk.configure(min_bytes=-1)


def test_small_tensors_stay_on_the_legacy_kernel_by_default():
    rk.configure(min_bytes=rk.MIN_BYTES)
    small = view((2, 8, 5, 6))
    assert rk.activation_promotion("relu", 0.0, small, (small.strides,), False, True) is None
    n = rk.MIN_BYTES // 4  # float32 elements in MIN_BYTES
    big = view((4, 16, 64, n // (4 * 16 * 64)))
    assert isinstance(rk.activation_promotion("relu", 0.0, big, (big.strides,), False, True),
                      rk.Promotion)
    nhwc = view((2, 8, 5, 6), "bfloat16", strides=(240, 1, 48, 8))
    assert rk.batch_norm_inference_promotion(nhwc, np.float32, 1e-5) is None


@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("n", [8, 32, 512, 420, 32 * 1000, 32 * 256 * 56 * 56, 3 * 224 * 224 * 32,
                               2 * 3 * 5 * 7 * 11])
def test_flat_layout_is_dense_channels_last_with_a_power_of_two_c(n, itemsize):
    shape, strides = rk.flat_layout(n, itemsize)
    assert math.prod(shape) == n and shape[0] == 1
    c, h, w = shape[1:]
    assert c & (c - 1) == 0 and 2 <= c <= 256 and h > 1 and w > 1
    assert strides == (c * h * w, 1, c * w, c)  # NHWC, dense
    assert rk.dense(view((1, c, h, w), strides=strides))


def test_flat_layout_takes_128_bytes_of_c_where_it_can():
    assert rk.flat_layout(32 * 64 * 112 * 112, 2)[0][1] == 64  # bfloat16, float16
    assert rk.flat_layout(32 * 64 * 112 * 112, 4)[0][1] == 32  # float32
    # n = 4 x odd: the largest power of two that divides n, below 128 bytes
    assert rk.flat_layout(4 * 3 * 5 * 7 * 11, 2)[0][1] == 4
    # 128 bytes of C leaves H x W prime: the next smaller C, then larger ones
    assert rk.flat_layout(64 * 13, 2)[0][1] == 32


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 7, 13, 2 * 13, 3 * 5 * 7])
def test_flat_layout_refuses_what_has_no_such_block(n):
    # odd counts have no C >= 2; 2 x prime, 4 = 2 x 2 leave H or W at 1
    assert rk.flat_layout(n, 4) is None


def test_dense_means_a_permutation_of_a_contiguous_block():
    assert rk.dense(view((2, 3, 4, 5)))
    assert rk.dense(view((2, 3, 4, 5), strides=(60, 1, 15, 3)))  # channels-last
    assert not rk.dense(view((2, 3, 4, 5), strides=(120, 40, 10, 2)))  # gaps
    assert not rk.dense(view((2, 3), strides=(0, 1)))  # broadcast


def test_which_activation_signatures_can_be_compiled():
    x = view((2, 8, 5, 6))
    assert isinstance(rk.activation_promotion("relu", 0.0, x, (x.strides,), False, True),
                      rk.Promotion)
    assert isinstance(rk.activation_promotion("elu", 1.0, x, (x.strides, x.strides), True,
                                              True), rk.Promotion)
    # NaN not propagated, a mode the graph has no kernel for, float64, a strided view, operands
    # in another layout, a count with no flat block
    assert rk.activation_promotion("relu", 0.0, x, (x.strides,), False, False) is None
    assert rk.activation_promotion("identity", 0.0, x, (x.strides,), False, True) is None
    d = view((2, 8, 5, 6), "float64")
    assert rk.activation_promotion("relu", 0.0, d, (d.strides,), False, True) is None
    s = view((2, 8, 5, 6), strides=(480, 60, 12, 2))
    assert rk.activation_promotion("relu", 0.0, s, (s.strides,), False, True) is None
    assert rk.activation_promotion("relu", 0.0, x, ((240, 1, 48, 8),), False, True) is None
    p = view((13,))
    assert rk.activation_promotion("relu", 0.0, p, (p.strides,), False, True) is None
    # backward where the legacy and compiled kernels differ at a kink: kept on the legacy one
    both = (x.strides, x.strides)
    assert rk.activation_promotion("clipped_relu", 6.0, x, both, True, True) is None
    assert rk.activation_promotion("elu", 0.5, x, both, True, True) is None
    # ReLU's backward differs at NaN/inf/0 inputs between the two kernels (the legacy one reads
    # y, the graph's x)
    assert rk.activation_promotion("relu", 0.0, x, both, True, True) is None
    assert isinstance(rk.activation_promotion("elu", 1.0, x, both, True, True), rk.Promotion)
    assert isinstance(rk.activation_promotion("clipped_relu", 6.0, x, (x.strides,), False, True),
                      rk.Promotion)


def test_the_sigmoid_gradient_is_compiled_from_the_output():
    x = view((2, 8, 5, 6))
    for mode, from_y in (("sigmoid", True), ("elu", False)):
        # (relu's and clipped relu's are not compiled)
        p = rk.activation_promotion(mode, 1.0, x, (x.strides,) * 3, True, True)
        assert p.reads_output is from_y, mode
        assert rk.activation_promotion(mode, 1.0, x, (x.strides,), False, True).reads_output is False
    for mode in ("tanh", "swish"):  # their graph runs from the first call (PyTorch's formulas)
        assert rk.activation_promotion(mode, 1.0, x, (x.strides,) * 3, True, True) is None
        assert rk.activation_promotion(mode, 1.0, x, (x.strides,), False, True) is not None


def test_which_batch_norm_signatures_can_be_compiled():
    nhwc = view((2, 8, 5, 6), "bfloat16", strides=(240, 1, 48, 8))
    assert isinstance(rk.batch_norm_inference_promotion(nhwc, np.float32, 1e-5), rk.Promotion)
    nchw = view((2, 8, 5, 6), "bfloat16")
    assert rk.batch_norm_inference_promotion(nchw, np.float32, 1e-5) is None
    one = view((2, 8, 1, 1), "float32")
    assert rk.batch_norm_inference_promotion(one, np.float32, 1e-5) is None
    d = view((2, 8, 5, 6), "float64", strides=(240, 1, 48, 8))
    assert rk.batch_norm_inference_promotion(d, np.float64, 1e-5) is None


def test_a_failed_build_leaves_the_signature_on_the_legacy_kernel(monkeypatch):
    import pycudnn.runtime.handle as handle

    def no_gpu(*args, **kwargs):
        raise pycudnn.PycudnnError("no GPU here")

    monkeypatch.setattr(rk, "get_handle", no_gpu)
    rk.configure(after_calls=2, background=False)
    x = view((2, 8, 5, 6))
    p = rk.activation_promotion("relu", 0.0, x, (x.strides,), False, True)
    before = rk.stats()
    p.tick()
    assert rk.stats() == before  # the first call asks for nothing
    p.tick()
    after = rk.stats()
    assert after["failed"] == before["failed"] + 1 and after["building"] == 0
    assert p.plan is None and "no GPU here" in p.error
    assert p.launch(0, (ADDR, ADDR)) is False  # nothing to launch: the caller runs legacy
    p.tick()
    assert rk.stats() == after  # asked once only
    assert handle.get_handle is not no_gpu


def test_background_build_failure_is_counted_and_waited_for(monkeypatch):
    monkeypatch.setattr(rk, "get_handle", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("no GPU here")))
    rk.configure(after_calls=1, background=True)
    x = view((2, 8, 5, 7))
    p = rk.activation_promotion("tanh", 0.0, x, (x.strides,), False, True)
    before = rk.stats()
    p.tick()
    assert rk.wait(timeout=30)
    assert rk.stats()["failed"] == before["failed"] + 1 and rk.stats()["building"] == 0
    assert "no GPU here" in p.error


def test_a_signature_past_its_count_builds_once_the_settings_allow_it(monkeypatch):
    """Disabled while a signature passed its count, or after_calls lowered below a signature's
    count: the next call asks for the build (once), not never."""
    monkeypatch.setattr(rk, "get_handle", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("no GPU here")))  # a build fails here: counted as failed, i.e. asked for
    rk.configure(after_calls=3, background=False, enabled=False)
    x = view((2, 8, 5, 8))
    p = rk.activation_promotion("relu", 0.0, x, (x.strides,), False, True)
    before = rk.stats()
    for _ in range(5):
        p.tick()
    assert rk.stats() == before  # disabled: nothing asked
    rk.configure(enabled=True)
    p.tick()
    assert rk.stats()["failed"] == before["failed"] + 1
    p.tick()
    assert rk.stats()["failed"] == before["failed"] + 1  # once
    q = rk.activation_promotion("sigmoid", 0.0, x, (x.strides,), False, True)
    q.tick()
    q.tick()
    rk.configure(after_calls=2)
    q.tick()
    assert rk.stats()["failed"] == before["failed"] + 2


# ---- the build queue and the ready plans stay bounded -----------------------------------------

class _FakePlan:
    workspace_size = 0
    tag = "fake"

    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def _succeeding_builds(monkeypatch, built):
    """A build that 'succeeds' without a GPU: the graph steps return made-up objects."""
    monkeypatch.setattr(rk, "get_handle", lambda *a, **k: 0)
    monkeypatch.setattr(rk, "engine_configs", lambda *a, **k: [])
    monkeypatch.setattr(rk, "filter_candidates", lambda c, *a, **k: (c, []))

    def first_plan(handle, kept, max_attempts):
        plan = _FakePlan()
        built.append(plan)
        return plan, []

    monkeypatch.setattr(rk, "first_plan", first_plan)


def test_a_plan_evicted_from_its_cache_builds_nothing_and_leaves_ready(monkeypatch):
    from pycudnn.ops._common import PlanCache

    built = []
    _succeeding_builds(monkeypatch, built)
    rk.configure(after_calls=1, background=False)
    x = view((2, 8, 5, 9))
    cache = PlanCache(limit=2)
    holders = []
    for i in range(3):  # the third put evicts the first signature's plan
        holder = type("Plan", (), {})()
        holder.fast = rk.activation_promotion("relu", 0.0, x, (x.strides,), False, True)
        holder.fast._build = lambda handle: None
        holders.append(holder)
    before = rk.stats()
    holders[0].fast.tick()  # built inline: ready
    assert rk.stats()["ready"] == before["ready"] + 1
    for i, h in enumerate(holders):
        cache.put(("sig", i), h)
    assert holders[0].fast.retired and holders[0].fast.plan is None
    assert rk.stats()["ready"] == before["ready"]  # counted out again
    holders[0].fast.tick()
    assert len(built) == 1  # an evicted signature never builds again
    # a queued build of a signature evicted before the worker reached it is skipped
    cache.clear()
    assert holders[1].fast.retired and holders[2].fast.retired
    rk.configure(background=True)
    holders[1].fast.requested = False
    holders[1].fast.retired = False
    release = __import__("threading").Event()
    blocker = rk.kernel_worker().submit(release.wait)  # the single worker is busy
    holders[1].fast.tick()
    holders[1].fast.retire()
    release.set()
    blocker.result(timeout=30)
    assert rk.wait(timeout=30)
    assert len(built) == 1 and rk.stats()["building"] == before["building"]


def test_the_background_queue_is_bounded(monkeypatch):
    import threading

    built = []
    _succeeding_builds(monkeypatch, built)
    rk.configure(after_calls=1, background=True)
    release = threading.Event()
    blocker = rk.kernel_worker().submit(release.wait)
    x = view((2, 8, 5, 10))
    proms = []
    try:
        for _ in range(rk.MAX_QUEUED_BUILDS + 5):
            p = rk.activation_promotion("relu", 0.0, x, (x.strides,), False, True)
            p._build = lambda handle: None
            p.tick()
            proms.append(p)
        asked = [p for p in proms if p.requested]
        assert len(asked) <= rk.MAX_QUEUED_BUILDS
        assert not proms[-1].requested  # a later call asks again
    finally:
        release.set()
        blocker.result(timeout=30)
        assert rk.wait(timeout=30)
    proms[-1].tick()
    assert proms[-1].requested
    assert rk.wait(timeout=30)
    for p in proms:
        p.retire()
