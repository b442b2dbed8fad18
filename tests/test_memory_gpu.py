"""Where and when pycudnn frees the device memory it allocates.

* The CPU tests (no ``gpu`` mark) replace the driver by a recorder and check which stream each
  free is ordered on and which device is current then: memory allocated on the per-thread
  default stream and dropped by another thread is freed on the legacy stream (which waits for
  every thread's per-thread stream), never on the dropping thread's own per-thread stream; a
  buffer of device 0 dropped while device 1 is current is freed with device 0 current; a
  synchronous free waits for the device first.
* The GPU tests reproduce the damage those frees did: another thread's result overwritten (per-
  thread streams), a result on one device overwritten after a free ordered on another device's
  stream (two GPUs), and an output on a raw stream handle reused while its convolution still ran.
  Results are checked against float64 NumPy references.
"""

from __future__ import annotations

import contextlib
import gc
import queue
import threading
from typing import Any

import numpy as np
import pytest

import reference as R

gpu = pytest.mark.gpu


# ---- CPU: the stream and device of each free ---------------------------------------------------

class _Driver:
    """Stands in for libcuda's cuMemAllocAsync / cuMemFreeAsync, and records the calls of a
    synchronous free in ``sync.calls``."""

    def __init__(self, current: list, sync: "_Runtime") -> None:
        self.current = current
        self.sync = sync
        self.frees: list[tuple[int, int, int]] = []  # (ptr, stream, device current at the free)
        self.next_ptr = 0x7F0000000000
        self.capturing: set[int] = set()  # the streams cuStreamIsCapturing says are captured

    def allocate(self, nbytes: int, stream: int) -> int:
        self.next_ptr += 1 << 24
        return self.next_ptr

    def free(self, ptr: int, stream: int) -> int:
        self.frees.append((ptr, stream, self.current[0]))
        return 0

    def cuCtxSynchronize(self) -> int:
        self.sync.calls.append(("cuCtxSynchronize",))
        return self.sync.status

    def cuMemFree(self, ptr: int) -> int:
        self.sync.calls.append(("cuMemFree", ptr))
        return 0

    def cuStreamIsCapturing(self, stream: int, status: Any) -> int:
        status._obj.value = int(stream in self.capturing)
        return 0


class _Runtime:
    """The record of a synchronous free's calls (``status``: what the synchronize answers)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.status = 0


@pytest.fixture
def fake_cuda(monkeypatch):
    """(driver, runtime, current device) of a made-up 2-device machine, current device 1."""
    from pycudnn.runtime import memory

    current = [1]

    @contextlib.contextmanager
    def device_guard(device):
        prev, current[0] = current[0], device
        try:
            yield device
        finally:
            current[0] = prev

    rt = _Runtime()
    drv = _Driver(current, rt)
    monkeypatch.setattr(memory.driver, "loaded", drv)
    monkeypatch.setattr(memory.devices, "visible_devices", 2)
    _patch_everywhere(monkeypatch, "device_guard", device_guard)
    # blocks kept for reuse: the made-up ones must never reach a real allocation (nor real ones
    # these tests' frees)
    _patch_everywhere(monkeypatch, "blocks", {})
    _patch_everywhere(monkeypatch, "stream_blocks", {})
    _patch_everywhere(monkeypatch, "block_bytes", [0])
    return drv, rt, current


def _patch_everywhere(monkeypatch, name, value):
    """Swap ``name`` in every module of pycudnn.runtime.memory that binds it (a name imported
    from another module of the package is looked up in the importing one)."""
    import types

    from pycudnn.runtime import memory

    modules = [m for m in vars(memory).values()
               if isinstance(m, types.ModuleType) and m.__name__.startswith(memory.__name__ + ".")]
    assert any(hasattr(m, name) for m in modules), name
    for module in modules:
        if hasattr(module, name):
            monkeypatch.setattr(module, name, value)


def _in_thread(fn):
    errors = []

    def run():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]


def test_per_thread_stream_memory_dropped_by_another_thread_is_freed_on_the_legacy_stream(fake_cuda):
    from pycudnn.runtime import memory
    from pycudnn.runtime.memory import pool

    drv, _, _ = fake_cuda
    mine = memory.allocate_fast(4096, 0, 2)
    theirs = memory.allocate_fast(4096, 0, 2)
    mine_ptr, theirs_ptr = mine.ptr, theirs.ptr
    mine.close()  # the allocating thread: its own per-thread stream
    holder = [theirs]
    del theirs
    _in_thread(lambda: holder.pop())  # the last reference dropped on another thread
    # kept for reuse on the legacy stream (it waits for every thread's per-thread stream), and
    # freed there when the kept blocks are given back
    assert drv.frees == [(mine_ptr, 2, 0)]
    pool.release_kept_blocks()
    assert drv.frees == [(mine_ptr, 2, 0), (theirs_ptr, 0, 0)]


def test_per_thread_stream_memory_closed_on_another_thread_is_freed_on_the_legacy_stream(fake_cuda):
    from pycudnn.runtime import memory

    drv, _, _ = fake_cuda
    a = memory.allocate_fast(4096, 0, 2)
    ptr = a.ptr
    _in_thread(a.close)
    assert drv.frees == [(ptr, 1, 0)]


@pytest.mark.parametrize("stream", [0, 1, 2])
def test_free_on_a_default_stream_makes_the_allocations_device_current(fake_cuda, stream):
    """0, 1 and 2 name a stream of the current device: device 0's memory dropped while device 1
    is current must be freed on device 0's stream, and device 1 made current again."""
    from pycudnn.runtime import memory
    from pycudnn.runtime.memory import pool

    drv, _, current = fake_cuda
    a = memory.allocate_fast(4096, 0, stream)
    ptr = a.ptr
    del a
    gc.collect()
    # only this block's frees: a collection on a GPU machine also finalizes real buffers of
    # earlier tests, whose frees reach the made-up driver too
    mine = lambda: [f for f in drv.frees if f[0] == ptr]  # noqa: E731
    if stream < 2:  # the legacy stream's blocks are kept for reuse, freed when given back
        assert mine() == []
        pool.release_kept_blocks()
        stream = 0
    assert mine() == [(ptr, stream, 0)]
    assert current == [1]


def test_a_kept_block_goes_to_the_next_allocation_of_its_size_on_the_legacy_stream(fake_cuda):
    from pycudnn.runtime import memory
    from pycudnn.runtime.memory import pool

    drv, _, _ = fake_cuda
    a = memory.allocate_fast(4096, 0, 0)
    ptr = a.ptr
    del a
    b = memory.allocate_fast(4096, 0, 1)  # 0 and 1 both name the legacy stream
    c = memory.allocate_fast(4096, 0, 0)  # none kept any more: a new block
    d = memory.allocate_fast(8192, 0, 0)  # another size: a new block
    assert b.ptr == ptr and len({b.ptr, c.ptr, d.ptr}) == 3
    assert drv.frees == []
    big = memory.allocate_fast(pool.KEEP_BLOCK_MAX + 1, 0, 0)
    big_ptr = big.ptr
    del big  # too large to keep: freed at once
    assert drv.frees == [(big_ptr, 0, 0)]


def test_free_on_a_created_stream_needs_no_device_switch(fake_cuda):
    from pycudnn.runtime import memory

    drv, _, _ = fake_cuda
    a = memory.allocate_fast(4096, 0, 0x5000, stream_ref=object())
    ptr = a.ptr
    a.close()
    assert drv.frees == [(ptr, 0x5000, 1)]  # the stream belongs to device 0 itself


def test_synchronous_free_waits_for_the_device_first(fake_cuda):
    """cuMemFree does not wait for stream-ordered work still using the memory."""
    from pycudnn.runtime import memory

    drv, rt, _ = fake_cuda
    a = memory.allocate_fast(4096, 0, 0x5000)  # a raw handle: the stream may be gone when freed
    assert a.sync_free
    ptr = a.ptr
    del a
    gc.collect()
    assert rt.calls == [("cuCtxSynchronize",), ("cuMemFree", ptr)]
    assert drv.frees == []


def test_evicted_thread_workspace_is_freed_after_a_device_synchronize(fake_cuda):
    from pycudnn.runtime.memory import workspaces

    drv, rt, _ = fake_cuda
    ptrs = []

    def work():
        for stream in range(0x5000, 0x5000 + workspaces.THREAD_WORKSPACES_MAX + 1):
            ptrs.append(workspaces.thread_workspace(1 << 20, 0, stream))

    _in_thread(work)
    assert rt.calls[:2] == [("cuCtxSynchronize",), ("cuMemFree", ptrs[0])]


def _with_stream_ids(drv, ids):
    """Give the made-up driver cuStreamGetId, answering from ``ids`` (handle -> id)."""
    import ctypes

    def stream_id(stream, out_address):
        ctypes.c_uint64.from_address(out_address).value = ids[stream]
        return 0

    drv.stream_id = stream_id


def test_a_thread_workspace_is_not_reused_by_a_new_stream_with_a_destroyed_streams_handle(
        fake_cuda):
    """The driver hands a destroyed stream's handle to the next stream made;
    that stream's work is not ordered after the old one's, so the old workspace must not serve
    it. The key holds the driver's stream id (cuStreamGetId), which is never reused."""
    from pycudnn.runtime.memory import workspaces

    drv, rt, _ = fake_cuda
    ids = {0x5000: 7}
    _with_stream_ids(drv, ids)
    got = []

    def work():
        got.append(workspaces.thread_workspace(1 << 20, 0, 0x5000))
        got.append(workspaces.thread_workspace(1 << 20, 0, 0x5000))  # same stream: reused
        ids[0x5000] = 8  # the stream was destroyed, a new one got its handle
        got.append(workspaces.thread_workspace(1 << 20, 0, 0x5000))
        got.append(workspaces.thread_workspace(1 << 20, 0, 0x5000))

    _in_thread(work)
    assert got[0] == got[1] and got[2] == got[3] and got[2] != got[0]
    # the old stream's workspace freed after a device synchronize (its stream is gone), never
    # ordered on the handle, which now names the new stream
    assert rt.calls[:2] == [("cuCtxSynchronize",), ("cuMemFree", got[0])]
    assert all(f[0] != got[0] for f in drv.frees)


def test_a_block_dropped_on_a_created_stream_goes_to_that_stream_only(fake_cuda):
    """Dropped on a created stream, a block is kept under the stream's driver id and handed to
    the next allocation of its size on that stream: no stream-ordered free, no synchronize (a
    raw handle's memory used to be freed after a device synchronize each time). A new stream
    that got a destroyed stream's handle has another id and never gets the old stream's block."""
    from pycudnn.runtime import memory
    from pycudnn.runtime.memory import pool

    drv, rt, _ = fake_cuda
    ids = {0x5000: 7, 0x6000: 9}
    _with_stream_ids(drv, ids)
    ref = object()  # a stream object: kept alive while its memory is
    a = memory.allocate_fast(4096, 0, 0x5000, ref)
    raw = memory.allocate_fast(8192, 0, 0x5000)  # a raw handle
    first, first_raw = a.ptr, raw.ptr
    del a, raw
    gc.collect()
    assert pool.stream_blocks == {(0, 7, 4096): [first], (0, 7, 8192): [first_raw]}
    assert drv.frees == [] and rt.calls == []
    other = memory.allocate_fast(4096, 0, 0x6000, ref)  # another stream: not that block
    assert other.ptr != first
    again = memory.allocate_fast(4096, 0, 0x5000, ref)
    assert again.ptr == first and pool.stream_blocks[(0, 7, 4096)] == []
    del again
    gc.collect()
    ids[0x5000] = 8  # the stream was destroyed and a new one got its handle
    new = memory.allocate_fast(4096, 0, 0x5000, ref)
    assert new.ptr != first and pool.stream_blocks[(0, 7, 4096)] == [first]


def test_no_block_is_kept_or_reused_while_its_stream_is_captured(fake_cuda):
    """A graph captured on the stream would keep the block's address: a kept block is not
    handed out during a capture, and memory allocated during one is freed, not kept."""
    from pycudnn.runtime import memory
    from pycudnn.runtime.memory import pool

    drv, _, _ = fake_cuda
    _with_stream_ids(drv, {0x5000: 7})
    ref = object()
    a = memory.allocate_fast(4096, 0, 0x5000, ref)
    kept = a.ptr
    del a
    gc.collect()
    drv.capturing = {0x5000}
    b = memory.allocate_fast(4096, 0, 0x5000, ref)
    assert b.ptr != kept
    b_ptr = b.ptr
    del b
    gc.collect()
    assert pool.stream_blocks[(0, 7, 4096)] == [kept]
    assert drv.frees[-1][:2] == (b_ptr, 0x5000)  # freed on its stream, in the capture


def test_workspaces_and_sync_free_memory_are_never_kept(fake_cuda):
    from pycudnn.runtime import memory
    from pycudnn.runtime.memory import pool

    drv, rt, _ = fake_cuda
    _with_stream_ids(drv, {0x5000: 7})
    a = memory.allocate_fast(4096, 0, 0x5000, object(), sync_free=True)
    ptr = a.ptr
    del a
    gc.collect()
    assert pool.stream_blocks == {} and rt.calls == [("cuCtxSynchronize",), ("cuMemFree", ptr)]


def test_blocks_of_created_streams_are_released_after_a_synchronize(fake_cuda):
    """Their streams may be gone: released blocks are freed after a device synchronize with
    cuMemFree, never ordered on a handle; kept when the device cannot be synchronized."""
    from pycudnn.runtime import memory
    from pycudnn.runtime.memory import pool

    drv, rt, _ = fake_cuda
    _with_stream_ids(drv, {0x5000: 7})
    a = memory.allocate_fast(4096, 0, 0x5000, object())
    ptr = a.ptr
    del a
    gc.collect()
    rt.status = 900  # another thread captures a graph: no synchronize now
    assert pool.release_kept_blocks() == 0 and pool.stream_blocks[(0, 7, 4096)] == [ptr]
    rt.status = 0
    assert pool.release_kept_blocks() == 4096 and pool.stream_blocks[(0, 7, 4096)] == []
    assert rt.calls[-2:] == [("cuCtxSynchronize",), ("cuMemFree", ptr)]
    assert drv.frees == [] and pool.block_bytes == [0]


def test_stream_identity_of_the_default_streams_is_their_handle(fake_cuda):
    from pycudnn.runtime.memory import streams

    assert [streams.stream_identity(s) for s in (0, 1, 2)] == [0, 1, 2]
    assert streams.stream_identity(0x5000) == -1  # the recorder has no cuStreamGetId


def test_a_synchronous_free_that_cannot_synchronize_keeps_the_memory_and_does_not_raise(fake_cuda):
    """While another thread captures a CUDA graph, cuCtxSynchronize fails: the evicting call
    must neither free memory that may still be in use nor fail because of it."""
    from pycudnn.runtime.memory import workspaces

    drv, rt, _ = fake_cuda
    rt.status = 900  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    ptrs = []

    def work():
        for stream in range(0x5000, 0x5000 + workspaces.THREAD_WORKSPACES_MAX + 1):
            ptrs.append(workspaces.thread_workspace(1 << 20, 0, stream))

    _in_thread(work)  # the eviction of the first workspace neither raised ...
    assert len(ptrs) == workspaces.THREAD_WORKSPACES_MAX + 1
    assert ("cuMemFree", ptrs[0]) not in rt.calls  # ... nor freed it


def test_nothing_is_freed_once_interpreter_shutdown_began(fake_cuda, monkeypatch):
    from pycudnn.runtime import memory

    drv, rt, _ = fake_cuda
    a = memory.allocate_fast(4096, 0, 0)
    b = memory.allocate_fast(4096, 0, 0x5000)
    monkeypatch.setattr(memory.bindings, "shutting_down", True)
    del a, b
    gc.collect()
    assert drv.frees == [] and rt.calls == []


def test_device_buffer_of_the_per_thread_stream_freed_by_another_thread(fake_cuda):
    from pycudnn.runtime import memory

    drv, _, _ = fake_cuda
    token = memory.thread_token()
    own = memory.DeviceBuffer(0x1000, 256, 0, 2, thread=token)
    other = memory.DeviceBuffer(0x2000, 256, 0, 2, thread=token)
    own.close()
    assert [f[:2] for f in drv.frees] == [(0x1000, 2)]  # its per-thread stream, on its thread
    holder = [other]
    del other
    _in_thread(lambda: holder.pop())
    assert [f[:2] for f in drv.frees] == [(0x1000, 2), (0x2000, 1)]  # the legacy stream
    closed = memory.DeviceBuffer(0x3000, 256, 0, 2, thread=token)
    _in_thread(closed.close)
    assert [f[:2] for f in drv.frees][-1] == (0x3000, 1)


def test_device_buffer_on_a_raw_stream_handle_is_freed_after_a_device_synchronize(fake_cuda):
    """A raw handle's stream may be destroyed before the buffer is collected: the finalizer
    synchronizes the device and frees with cuMemFree, never ordered on the handle."""
    from pycudnn.runtime import memory

    drv, rt, _ = fake_cuda
    buf = memory.DeviceBuffer(0x4000, 256, 0, 0x5000, sync_release=True)
    del buf
    gc.collect()
    assert rt.calls == [("cuCtxSynchronize",), ("cuMemFree", 0x4000)] and drv.frees == []


@pytest.fixture
def fallback_workspaces(fake_cuda, monkeypatch):
    """allocate_fast on its careful path: the driver's stream-ordered allocation answers 0, so
    every workspace is a DeviceBuffer from allocate(), freed through the made-up driver."""
    from pycudnn.runtime import memory

    drv, rt, _ = fake_cuda
    drv.allocate = lambda nbytes, stream: 0
    made: list = []

    def allocate(nbytes, device=None, stream=None, **kw):
        ptr = 0x6000_0000_0000 + (len(made) + 1) * (1 << 24)
        made.append((ptr, nbytes, stream))
        return memory.DeviceBuffer(ptr, nbytes, device, stream)

    monkeypatch.setattr(memory.stream_allocation, "allocate", allocate)
    return drv, rt, made


def test_evicting_a_fallback_thread_workspace_frees_it_after_a_device_synchronize(
        fallback_workspaces):
    from pycudnn.runtime.memory import workspaces

    drv, rt, made = fallback_workspaces
    ptrs = []

    def work():
        for stream in range(0x5000, 0x5000 + workspaces.THREAD_WORKSPACES_MAX + 1):
            ptrs.append(workspaces.thread_workspace(1 << 20, 0, stream))
        # the first evicted: freed only after waiting for the device (its stream may be gone)
        assert rt.calls == [("cuCtxSynchronize",), ("cuMemFree", ptrs[0])]
        assert drv.frees == []

    _in_thread(work)
    assert [m[2] for m in made] == list(range(0x5000, 0x5000 + len(ptrs)))
    assert len(set(ptrs)) == len(ptrs)


def test_a_fallback_thread_workspace_of_a_destroyed_stream_is_freed_synchronously(
        fallback_workspaces):
    import ctypes

    from pycudnn.runtime.memory import workspaces

    drv, rt, _ = fallback_workspaces
    ids = {0x5000: 7}

    def stream_id(stream, out_address):
        ctypes.c_uint64.from_address(out_address).value = ids[stream]
        return 0

    drv.stream_id = stream_id
    got = []

    def work():
        got.append(workspaces.thread_workspace(1 << 20, 0, 0x5000))
        ids[0x5000] = 8  # the stream was destroyed, a new one got its handle
        got.append(workspaces.thread_workspace(1 << 20, 0, 0x5000))
        assert rt.calls == [("cuCtxSynchronize",), ("cuMemFree", got[0])] and drv.frees == []

    _in_thread(work)
    assert got[0] != got[1]


def test_a_fallback_thread_workspace_grown_on_its_stream_is_freed_on_that_stream(
        fallback_workspaces):
    from pycudnn.runtime.memory import workspaces

    drv, rt, _ = fallback_workspaces
    got = []

    def work():
        got.append(workspaces.thread_workspace(1 << 20, 0, 0x5000))
        got.append(workspaces.thread_workspace(1 << 22, 0, 0x5000))  # larger: replaced
        # the allocation stream, still in use: stream-ordered, no wait
        assert [f[:2] for f in drv.frees] == [(got[0], 0x5000)]
        assert rt.calls == []

    _in_thread(work)


def test_a_fallback_workspace_that_cannot_be_freed_synchronously_is_kept_not_freed(
        fallback_workspaces):
    from pycudnn.runtime.memory import workspaces

    drv, rt, _ = fallback_workspaces
    rt.status = 900  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: another thread is capturing
    ptrs = []

    def work():
        for stream in range(0x5000, 0x5000 + workspaces.THREAD_WORKSPACES_MAX + 1):
            ptrs.append(workspaces.thread_workspace(1 << 20, 0, stream))
        # neither freed nor raised: the memory is kept while work may still use it
        assert rt.calls == [("cuCtxSynchronize",)] and drv.frees == []

    _in_thread(work)
    assert len(ptrs) == workspaces.THREAD_WORKSPACES_MAX + 1


# ---- GPU ---------------------------------------------------------------------------------------

F = dict(padding=1, engine="graph", allow_tf32=False)


def _err(got, ref) -> float:
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max())


def _busy(rng, device=None):
    """Inputs of a convolution that keeps a stream busy for a few milliseconds."""
    import pycudnn

    t = lambda a: pycudnn.from_numpy(a.astype(np.float32), device=device)  # noqa: E731
    bx, bw = t(rng.standard_normal((32, 256, 96, 96))), t(rng.standard_normal((256, 256, 3, 3)))
    return bx, bw, pycudnn.empty((32, 256, 96, 96), device=device)


@gpu
def test_per_thread_stream_result_dropped_by_another_thread_does_not_overwrite_its_result():
    """Thread A queues busy work, then y = conv(x) on its per-thread stream and hands y to
    thread B, which drops it and convolves on its own per-thread stream. Freeing y on B's
    per-thread stream let B's output take y's memory before A's kernel wrote y: A's late write
    replaced B's result."""
    import pycudnn
    from pycudnn.runtime import memory

    pycudnn.clear_caches()
    rng = np.random.default_rng(4)
    bx, bw, by = _busy(rng)
    x, x2 = (rng.standard_normal((8, 64, 64, 64)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    X, X2, W = pycudnn.from_numpy(x), pycudnn.from_numpy(x2), pycudnn.from_numpy(w)
    ref2 = R.conv_forward(x2, w, (1, 1), (1, 1), (1, 1), 1)
    pycudnn.convolution(X2, W, **F)  # searched once: later calls take the remembered path
    pycudnn.convolution(bx, bw, out=by, **F)
    memory.synchronize()
    handoff: queue.Queue = queue.Queue()
    ready, a_done = threading.Barrier(2, timeout=60), threading.Event()
    report: dict = {}
    errors: list = []

    def thread_a():
        try:
            pycudnn.convolution(X, W, stream=2, **F)  # warm: this thread's workspace
            pycudnn.convolution(bx, bw, out=by, stream=2, **F)
            memory.stream_synchronize(2)
            ready.wait()
            for _ in range(40):
                pycudnn.convolution(bx, bw, out=by, stream=2, **F)  # ~0.1 s queued
            y = pycudnn.convolution(X, W, stream=2, **F)  # written after the busy work
            handoff.put(y)
            del y
            memory.stream_synchronize(2)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            a_done.set()

    def thread_b():
        try:
            pycudnn.convolution(X2, W, stream=2, **F)  # warm: this thread's workspace
            memory.stream_synchronize(2)
            ready.wait()
            y = handoff.get(timeout=60)
            del y  # the last reference: dropped here
            y2 = pycudnn.convolution(X2, W, stream=2, **F)
            report["before"] = _err(y2.numpy(stream=2), ref2)
            assert a_done.wait(60)
            report["after"] = _err(y2.numpy(stream=2), ref2)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    ta, tb = threading.Thread(target=thread_a), threading.Thread(target=thread_b)
    ta.start()
    tb.start()
    ta.join()
    tb.join()
    assert not errors, errors
    assert report["before"] < 1e-4 and report["after"] < 1e-4, report


@gpu
def test_thread_workspaces_from_the_allocation_fallback_are_evicted_on_a_fifth_stream(monkeypatch):
    """With the driver's cuMemAllocAsync refusing, allocate_fast hands out allocate()'s
    DeviceBuffers; a thread using more streams than it keeps workspaces for evicts one of them.
    The workspaces stay writable and convolutions on every stream stay right (float64 NumPy)."""
    import pycudnn
    from cuda.bindings import runtime as rt
    from pycudnn.runtime.memory import copies, driver, workspaces

    real = driver.loaded or driver.driver()
    assert real, "libcuda must load where a GPU is usable"

    class Refusing:
        def allocate(self, nbytes, stream):
            return 0  # allocate_fast's careful path

        def __getattr__(self, name):
            return getattr(real, name)

    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    ref = R.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1)
    X, W = pycudnn.from_numpy(x), pycudnn.from_numpy(w)
    streams = []
    for _ in range(workspaces.THREAD_WORKSPACES_MAX + 2):
        err, s = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)
        assert not int(err)
        streams.append(int(s))
    errs: list[float] = []
    monkeypatch.setattr(driver, "loaded", Refusing())

    def work():
        for s in streams:
            ws = workspaces.thread_workspace(1 << 20, 0, s)
            copies.memset(ws, 1 << 20, s, value=7)
            y = pycudnn.convolution(X, W, padding=1, engine="graph", allow_tf32=False, stream=s)
            errs.append(_err(y.numpy(stream=s), ref))

    try:
        _in_thread(work)
    finally:
        monkeypatch.setattr(driver, "loaded", real)
        for s in streams:
            rt.cudaStreamSynchronize(s)
            rt.cudaStreamDestroy(s)
    assert len(errs) == len(streams) and max(errs) < 1e-5, errs


@gpu
def test_output_on_a_raw_stream_dropped_while_its_convolution_runs_is_not_reused_early():
    """An output on a raw stream handle (which may be destroyed before the output is collected)
    is freed synchronously: cudaFree alone would hand the memory to the next allocation while
    the kernel writing it is still queued."""
    import pycudnn
    from cuda.bindings import runtime as rt
    from pycudnn.runtime import memory

    pycudnn.clear_caches()
    rng = np.random.default_rng(6)
    bx, bw, by = _busy(rng)
    x, x2 = (rng.standard_normal((8, 64, 64, 64)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    X, X2, W = pycudnn.from_numpy(x), pycudnn.from_numpy(x2), pycudnn.from_numpy(w)
    ref2 = R.conv_forward(x2, w, (1, 1), (1, 1), (1, 1), 1)
    streams = []
    for _ in range(2):
        err, s = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)
        assert not int(err)
        streams.append(int(s))
    s1, s2 = streams
    try:
        for s in (s1, s2):  # warm: searched, remembered, workspaces made
            pycudnn.convolution(X, W, stream=s, **F)
            pycudnn.convolution(X2, W, stream=s, **F)
        pycudnn.convolution(bx, bw, out=by, stream=s1, **F)
        memory.synchronize()
        for _ in range(40):
            pycudnn.convolution(bx, bw, out=by, stream=s1, **F)  # ~0.1 s queued on s1
        y = pycudnn.convolution(X, W, stream=s1, **F)
        del y  # dropped while its convolution waits behind the busy work
        gc.collect()
        y2 = pycudnn.convolution(X2, W, stream=s2, **F)
        memory.synchronize()
        assert _err(y2.numpy(stream=s2), ref2) < 1e-4
    finally:
        memory.synchronize()
        for s in streams:
            rt.cudaStreamDestroy(s)


def _device_count() -> int:
    try:
        from pycudnn.runtime import memory

        return memory.device_count()
    except Exception:  # pragma: no cover - cuda.bindings missing
        return 0


@gpu
@pytest.mark.skipif(_device_count() < 2, reason=f"needs 2 CUDA devices; this machine has "
                    f"{_device_count()} (run on a 2-GPU machine to cover frees across devices)")
def test_device_0_result_dropped_while_device_1_is_current_is_freed_on_device_0():
    """y on device 0's legacy stream, dropped while device 1 is current: a free on "stream 0"
    then meant device 1's legacy stream, not ordered after device 0's kernel still writing y,
    and the next device-0 allocation on another stream got y's memory."""
    import pycudnn
    from cuda.bindings import runtime as rt
    from pycudnn.runtime import memory

    pycudnn.clear_caches()
    rng = np.random.default_rng(5)
    memory.ensure_device(0)
    bx, bw, by = _busy(rng, device=0)
    x, x2 = (rng.standard_normal((8, 64, 64, 64)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    X, X2, W = (pycudnn.from_numpy(a, device=0) for a in (x, x2, w))
    ref2 = R.conv_forward(x2, w, (1, 1), (1, 1), (1, 1), 1)
    err, s = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)
    assert not int(err)
    s = int(s)
    try:
        pycudnn.convolution(X, W, **F)  # warm (legacy stream workspace)
        pycudnn.convolution(X2, W, stream=s, **F)  # warm (stream s workspace)
        pycudnn.convolution(bx, bw, out=by, **F)
        memory.synchronize(0)
        for _ in range(40):
            pycudnn.convolution(bx, bw, out=by, **F)  # ~0.1 s on device 0's legacy stream
        y = pycudnn.convolution(X, W, **F)  # written after the busy work
        memory.ensure_device(1)  # the program moved on to device 1
        del y
        gc.collect()
        assert memory.current_device() == 1, "dropping the buffer changed the current device"
        memory.ensure_device(0)
        y2 = pycudnn.convolution(X2, W, stream=s, **F)
        before = _err(y2.numpy(stream=s), ref2)
        memory.synchronize(0)
        after = _err(y2.numpy(stream=s), ref2)
        assert before < 1e-4 and after < 1e-4, (before, after)
    finally:
        memory.ensure_device(0)
        memory.synchronize(0)
        rt.cudaStreamDestroy(s)


@pytest.mark.gpu
def test_outputs_dropped_on_the_legacy_stream_are_reused_and_given_back():
    """An output dropped on the legacy default stream is kept and handed to the next call of the
    same size there (no stream-ordered free and allocation between kernels); outputs alive at
    the same time never share memory; empty_cache gives the kept blocks back."""
    import pycudnn
    from pycudnn.runtime.memory import pool

    rng = np.random.default_rng(3)
    x_h = rng.standard_normal((2, 8, 9, 9)).astype(np.float32)
    w_h = rng.standard_normal((6, 8, 3, 3)).astype(np.float32)
    ref = R.conv_forward(x_h, w_h, (1, 1), (1, 1), (1, 1), 1)
    x, w = pycudnn.from_numpy(x_h), pycudnn.from_numpy(w_h)
    pycudnn.convolution(x, w, padding=1, allow_tf32=False)  # the first call: remembered
    pool.release_kept_blocks()
    y = pycudnn.convolution(x, w, padding=1, allow_tf32=False)  # a replay: the hot path's output
    first, nbytes = y.ptr, y.nbytes
    del y  # kept, not freed
    y = pycudnn.convolution(x, w, padding=1, allow_tf32=False)
    assert y.ptr == first
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)
    held = [pycudnn.convolution(x, w, padding=1, allow_tf32=False) for _ in range(3)]
    assert len({t.ptr for t in held} | {y.ptr}) == 4
    for t in held:
        np.testing.assert_allclose(t.numpy(), ref, rtol=1e-4, atol=1e-4)
    del held, y, t  # t: the loop's last output
    assert pool.release_kept_blocks(0) >= 4 * nbytes
    assert pool.release_kept_blocks(0) == 0


@gpu
def test_outputs_dropped_on_a_created_stream_are_reused_on_that_stream_only():
    """On a created stream (a raw handle here, whose memory used to be freed after a device
    synchronize), an output dropped is kept for that stream and handed to its next call of the
    same size; another stream never gets it, nor does a new stream given the destroyed one's
    handle; empty_cache frees the blocks."""
    import pycudnn
    from cuda.bindings import runtime as rt
    from pycudnn.runtime import memory
    from pycudnn.runtime.memory import pool

    rng = np.random.default_rng(4)
    x_h = rng.standard_normal((2, 8, 9, 9)).astype(np.float32)
    w_h = rng.standard_normal((6, 8, 3, 3)).astype(np.float32)
    ref = R.conv_forward(x_h, w_h, (1, 1), (1, 1), (1, 1), 1)
    x, w = pycudnn.from_numpy(x_h), pycudnn.from_numpy(w_h)

    def stream() -> int:
        err, s = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)
        assert not int(err)
        return int(s)

    s1, s2 = stream(), stream()
    try:
        for s in (s1, s2):
            pycudnn.convolution(x, w, padding=1, allow_tf32=False, stream=s)  # remembered
        y = pycudnn.convolution(x, w, padding=1, allow_tf32=False, stream=s1)
        first = y.ptr
        del y
        assert first in sum(pool.stream_blocks.values(), [])
        y2 = pycudnn.convolution(x, w, padding=1, allow_tf32=False, stream=s2)
        assert y2.ptr != first
        y1 = pycudnn.convolution(x, w, padding=1, allow_tf32=False, stream=s1)
        assert y1.ptr == first
        np.testing.assert_allclose(y1.numpy(stream=s1), ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(y2.numpy(stream=s2), ref, rtol=1e-4, atol=1e-4)
        del y1, y2
        memory.synchronize()
        rt.cudaStreamDestroy(s1)
        s3 = stream()  # the driver may hand it s1's handle: its id is new all the same
        s1 = 0
        y3 = pycudnn.convolution(x, w, padding=1, allow_tf32=False, stream=s3)
        assert y3.ptr != first
        np.testing.assert_allclose(y3.numpy(stream=s3), ref, rtol=1e-4, atol=1e-4)
        del y3
        memory.empty_cache()
        assert pool.stream_blocks and not any(pool.stream_blocks.values())
    finally:
        memory.synchronize()
        for s in (s1, s2, locals().get("s3", 0)):
            if s:
                rt.cudaStreamDestroy(s)
