"""GPU tests of pycudnn.runtime.handle: one handle per (thread, device), the pool, and the stream set."""

from __future__ import annotations

import ctypes
import gc
import threading
import time

import pytest

from pycudnn.ffi import library as _lib
from pycudnn.runtime import handle as H
from pycudnn.runtime import memory as M

pytestmark = pytest.mark.gpu


def stream_of(handle: int) -> int:
    out = ctypes.c_void_p()
    _lib.check(_lib.lib().cudnnGetStream(handle, ctypes.byref(out)), "cudnnGetStream")
    return out.value or 0


def in_thread(fn):
    out, errors = [], []

    def run():
        try:
            out.append(fn())
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    th = threading.Thread(target=run)
    th.start()
    th.join()
    if errors:
        raise errors[0]
    return out[0]


def wait_pooled(handle: int) -> None:
    for _ in range(300):
        gc.collect()
        if handle in H.pooled_handles(0):  # ended threads' queued handles included
            return
        time.sleep(0.01)
    raise AssertionError(f"handle {handle:#x} did not return to the pool")


def test_same_handle_twice_in_a_thread():
    h = H.get_handle(0)
    assert h and H.get_handle(0) == h and H.get_handle() == h
    assert H.get_handle(0, None) == h
    assert H.thread_handle_count() >= 1
    assert H.device_count() == M.device_count() >= 1


def test_concurrent_threads_get_different_handles():
    main = H.get_handle(0)
    barrier = threading.Barrier(3)
    got = []

    def worker():
        got.append(H.get_handle(0))
        barrier.wait(timeout=30)  # all alive together: none can have returned its handle yet

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(set(got)) == 3 and main not in got


def test_handle_returns_to_pool_and_is_reused():
    first = in_thread(lambda: H.get_handle(0))
    wait_pooled(first)
    created = H.live_handle_count(0)
    pooled = H.pooled_handle_count(0)
    second = in_thread(lambda: H.get_handle(0))
    assert second == first  # the pool is a stack: the last returned is taken first
    assert H.live_handle_count(0) == created  # nothing new was created
    wait_pooled(second)
    assert H.pooled_handle_count(0) == pooled


def test_stream_is_set_on_the_handle():
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    s1, s2 = dev.create_stream(), dev.create_stream()
    i1, i2 = int(s1.handle), int(s2.handle)
    h = H.get_handle(0)
    assert stream_of(H.get_handle(0, i1)) == i1
    assert stream_of(H.get_handle(0, s2)) == i2          # a cuda.core Stream object
    assert stream_of(H.get_handle(0, s1)) == i1          # back again: the skip must not stick
    assert stream_of(H.get_handle(0, i1)) == i1          # same again: skipped, still right
    assert stream_of(H.get_handle(0)) == 0               # None: the legacy default stream
    assert H.get_handle(0, s1) == h
    H.get_handle(0)  # leave the legacy default stream set: s1 and s2 die with this test


def test_stream_from_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    ts = torch.cuda.Stream(device=0)
    h = H.get_handle(0, ts)  # __cuda_stream__ or .cuda_stream
    assert stream_of(h) == ts.cuda_stream
    assert stream_of(H.get_handle(0, torch.cuda.current_stream(0))) in (0, 1)


def test_pooled_handle_gets_the_new_threads_stream():
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    s = dev.create_stream()

    h = in_thread(lambda: H.get_handle(0, s))  # leaves s set on the handle it returns to the pool
    wait_pooled(h)
    h2, stream = in_thread(lambda: (H.get_handle(0), stream_of(H.get_handle(0))))
    assert h2 == h
    assert stream == 0  # the new thread's stream (None), not the old thread's


def test_bad_device():
    with pytest.raises(ValueError, match="does not exist"):
        H.get_handle(M.device_count())
    with pytest.raises(ValueError, match=">= 0"):
        H.get_handle(-1)
