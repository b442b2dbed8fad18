"""Live counts and finalizers: a finalizer that runs while its own thread holds the counter's (or
the handle pool's) lock must not wait for it. The garbage collector can start inside any
allocation, so this happened for real on a GPU: a backend descriptor being counted
while a collected one's finalizer ran, and the test process hung. CPU only, real libcudnn."""

from __future__ import annotations

import collections
import gc
import threading

import pytest

from pycudnn.ffi import backend as B
from pycudnn.cudnn import descriptors as D
from pycudnn.runtime import handle as H
from pycudnn._live import LiveCounter


def _finishes(fn, timeout: float = 20.0) -> None:
    """Run fn in a thread; fail (instead of hanging the suite) if it does not finish in time."""
    errors: list[BaseException] = []

    def run():
        try:
            fn()
        except BaseException as exc:  # reported below
            errors.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "deadlock: a finalizer waited for a lock its own thread holds"
    if errors:
        raise errors[0]


def test_remove_while_the_lock_is_held_does_not_wait():
    c = LiveCounter()
    c.add("a")
    c.add("a")

    def inside_add():
        with c._lock:  # as if the collector ran a finalizer in the middle of add()
            c.remove("a")
    _finishes(inside_add)
    assert c.counts() == {"a": 1} and c.total() == 1
    c.remove("a")
    assert c.counts() == {"a": 0} and c.total() == 0


def test_counts_stay_exact_under_threads():
    c = LiveCounter()

    def work():
        for _ in range(2000):
            c.add(1)
            c.remove(1)
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.counts() == {1: 0}


class _Cycle:
    """Keeps a descriptor alive only through a reference cycle: freed by the collector."""

    def __init__(self, desc) -> None:
        self.desc = desc
        self.me = self


@pytest.mark.parametrize("make", [
    lambda: D.TensorDescriptor((2, 3, 4, 5), "float32"),
    lambda: B.BackendDescriptor(B.DescriptorType.TENSOR),
], ids=["legacy", "backend"])
def test_descriptors_collected_while_others_are_created(make):
    """With the collector running at almost every allocation, finalizers of cyclic garbage run
    during the creation of new descriptors (on Python 3.12+ at any bytecode boundary, so inside
    the counter's lock too: the hang once seen on a GPU): no hang, and the live counts come
    back to where they were."""
    gc.collect()
    before = (D.live_descriptor_count(), B.live_count())
    threshold = gc.get_threshold()

    def churn():
        gc.set_threshold(1, 1, 1)
        try:
            for _ in range(400):
                _Cycle(make())
        finally:
            gc.set_threshold(*threshold)
    _finishes(churn)
    gc.collect()
    assert (D.live_descriptor_count(), B.live_count()) == before


def test_thread_handles_are_queued_without_the_pool_lock():
    queue: collections.deque = collections.deque()
    handles = {0: 0x1234, 1: 0x5678}

    def finalizer_inside_acquire():
        with H._pool_lock:  # as if a finished thread's handle set were collected in _acquire
            H._give_back(handles, queue)
    _finishes(finalizer_inside_acquire)
    assert sorted(queue) == [(0, 0x1234), (1, 0x5678)] and handles == {}
