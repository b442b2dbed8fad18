"""The search's stream gate without a GPU: every hold that was queued is opened, whatever fails
between queuing it and opening it (starting the watchdog included), and the events made are
destroyed.

The CUDA driver is replaced by recorders here because the point is the host-side
ordering of hold/open around failures; what a hold does on a GPU is in test_benchmarks_timing.py
and the search's GPU tests.
"""

from __future__ import annotations

import ctypes
import threading
import time
import types

import pytest

from pycudnn.engines import graph
from pycudnn.errors import OutOfMemoryError
from pycudnn.runtime import gate as G
from pycudnn.runtime.memory import driver as DRV


class _Driver:
    """The CUDA driver's event calls, counted: a run of the search's timing loop makes no
    other driver call (it is installed as the loaded driver table)."""

    def __init__(self, fail_event_at: int | None = None) -> None:
        self.created = self.destroyed = 0
        self.recorded_on: list[int] = []
        self.fail_event_at = fail_event_at

    def cuEventCreate(self, out, flags):
        if self.fail_event_at is not None and self.created == self.fail_event_at:
            return 2  # CUDA_ERROR_OUT_OF_MEMORY
        self.created += 1
        out._obj.value = 0x5000 + self.created
        return 0

    def cuEventDestroy(self, ev):
        self.destroyed += 1
        return 0

    def cuEventRecord(self, ev, stream):
        self.recorded_on.append(stream)
        return 0

    def cuEventSynchronize(self, ev):
        return 0

    def cuEventElapsedTime(self, out, start, end):
        out._obj.value = 1.0
        return 0

    def error_text(self, code):
        return f"CUresult {code}"


class _Gate:
    def __init__(self, watchdog_fails: bool = False) -> None:
        self.held: list[int] = []
        self.opened: list[int] = []
        self.watchdog_fails = watchdog_fails

    def hold(self, stream):
        self.held.append(stream)
        return len(self.held)

    def open(self, g):
        self.opened.append(g)

    def watchdog(self, g):
        if self.watchdog_fails:
            raise RuntimeError("can't start new thread")
        return threading.Timer(60, lambda: None)  # never started; cancel() is harmless


class _Plan:
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def execute(self, handle, ptrs, wptr):
        if self.fail:
            raise KeyboardInterrupt  # an interrupt while the runs are queued


@pytest.fixture
def drv(monkeypatch):
    """Installs a recording driver in place of libcuda's table (`event_create()` ... take it)."""
    def install(**kw):
        fake = _Driver(**kw)
        monkeypatch.setattr(DRV, "loaded", fake)
        return fake
    return install


def _round(gate, runs=()):
    args = types.SimpleNamespace(stream=0x1234, handle=0)
    return graph.GraphEngine.gated_round(graph.GraphEngine(), args, gate, list(runs), (), 0)


def test_a_watchdog_that_cannot_start_still_opens_the_hold_and_frees_the_events(drv):
    rt, gate = drv(), _Gate(watchdog_fails=True)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        _round(gate)
    assert gate.held == [0x1234]
    assert gate.opened == [1]
    assert rt.created == rt.destroyed == 1


def test_an_interrupt_while_queuing_opens_the_hold(drv):
    rt, gate = drv(), _Gate()
    runs = [(types.SimpleNamespace(plan=_Plan(fail=True)), 3)]
    with pytest.raises(KeyboardInterrupt):
        _round(gate, runs)
    assert gate.opened == [1]
    assert rt.created == rt.destroyed == 2


def test_an_event_that_cannot_be_made_queues_no_hold_and_frees_the_others(drv):
    rt, gate = drv(fail_event_at=1), _Gate()
    runs = [(types.SimpleNamespace(plan=_Plan(fail=False)), 1)]
    with pytest.raises(OutOfMemoryError, match="cuEventCreate"):
        _round(gate, runs)
    assert gate.held == [] and gate.opened == []
    assert rt.created == rt.destroyed == 1


def test_a_successful_round_opens_once_and_times_each_candidate(drv):
    rt, gate = drv(), _Gate()
    runs = [(types.SimpleNamespace(plan=_Plan(fail=False)), 4),
            (types.SimpleNamespace(plan=_Plan(fail=False)), 2)]
    assert _round(gate, runs) == [0.25, 0.5]
    assert gate.opened == [1]
    assert rt.created == rt.destroyed == 3
    assert rt.recorded_on == [0x1234] * 3  # every event on the caller's stream


def _host_gate() -> G.StreamGate:
    """A StreamGate whose word lives in host memory and whose driver call is a recorder."""
    gate = object.__new__(G.StreamGate)
    gate._buf = ctypes.c_uint32(0)
    gate._word = gate._buf
    gate._init_watchdog()
    gate._dptr, gate._geq = 0, 0
    return gate


def test_stream_gate_opens_a_hold_whose_queuing_was_interrupted():
    gate = _host_gate()

    def interrupted(*a):
        raise KeyboardInterrupt

    gate._drv = types.SimpleNamespace(cuStreamWaitValue32=interrupted)
    with pytest.raises(KeyboardInterrupt):
        gate.hold(0x1234)
    assert gate._word.value == 1  # generation 1 is open: the stream cannot stay held


def test_stream_gate_watchdog_that_cannot_start_opens_the_hold(monkeypatch):
    gate = _host_gate()

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        gate.watchdog(3)
    assert gate._word.value == 3


def _recording_gate():
    gate = _host_gate()
    queued = []

    def wait(stream, dptr, value, flags):
        queued.append(value)
        return 0  # CUDA_SUCCESS

    gate._drv = types.SimpleNamespace(cuStreamWaitValue32=wait)
    return gate, queued


def test_a_hold_whose_generation_the_caller_never_kept_is_opened_by_its_watchdog(monkeypatch):
    monkeypatch.setattr(G, "WATCHDOG_S", 0.05)
    gate, queued = _recording_gate()
    gate.hold(0x1234)  # an interrupt here, before the caller stores the generation or arms a watchdog
    assert queued == [1]
    deadline = time.monotonic() + 10
    while gate._word.value < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gate._word.value == 1 and gate.opened_by_watchdog == 1
    assert gate._deadlines == {}


def test_one_thread_watches_every_hold_and_open_forgets_their_deadlines(monkeypatch):
    monkeypatch.setattr(G, "WATCHDOG_S", 0.05)
    gate, _ = _recording_gate()
    g1 = gate.hold(0x1234)
    thread = gate._thread
    assert thread.is_alive()
    threads = threading.active_count()
    g2 = gate.hold(0x1234)
    watch = gate.watchdog(g2)
    assert gate._thread is thread and threading.active_count() == threads  # no thread per hold
    assert sorted(gate._deadlines) == [g1, g2] and watch.generation == g2
    gate.open(g2)  # and every earlier hold
    watch.cancel()  # harmless after the open
    assert gate._deadlines == {} and gate._word.value == g2
    time.sleep(0.15)  # past both deadlines: nothing left for the watchdog to open
    assert gate.opened_by_watchdog == 0 and thread.is_alive()
    assert gate.watchdog(g1).generation == g1 and gate._deadlines == {}  # already open
    # a later hold the host never opens is opened by the same thread
    g3 = gate.hold(0x1234)
    deadline = time.monotonic() + 10
    while gate._word.value < g3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gate._word.value == g3 and gate.opened_by_watchdog == 1 and gate._thread is thread


def test_a_cancelled_watch_is_not_opened():
    gate, _ = _recording_gate()
    g = gate.hold(0x1234)
    gate.watchdog(g).cancel()
    assert gate._deadlines == {} and gate._word.value == 0
    gate.open(g)


def test_a_hold_without_a_thread_for_its_watchdog_queues_nothing(monkeypatch):
    gate, queued = _recording_gate()

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        gate.hold(0x1234)
    assert queued == [] and gate._deadlines == {}


def test_a_forked_child_gets_its_own_watchdog_thread():
    """The child of a fork has none of the parent's threads, and the parent's watchdog thread may
    hold the gate's lock at the fork (it takes it as soon as it starts): the child's first hold
    must neither wait for that lock nor for a thread that is gone. Forked just after the thread
    starts, twenty times."""
    import os
    import signal

    for _ in range(20):
        gate, _ = _recording_gate()
        gate.hold(0x1234)  # starts the watchdog's thread, which takes the lock at once
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 only if its hold is watched by a live thread
            ok = False
            try:
                g = gate.hold(0x1234)
                ok = gate._thread.is_alive() and g in gate._deadlines
            finally:
                os._exit(0 if ok else 1)
        deadline = time.monotonic() + 10
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.005)
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert done and status == 0, "the forked child's hold hung or went unwatched"
