"""The search's stream gate without a GPU: every hold that was queued is opened, whatever fails
between queuing it and opening it (starting the watchdog included), and the events made are
destroyed.

The CUDA runtime and driver are replaced by recorders here because the point is the host-side
ordering of hold/open around failures; what a hold does on a GPU is in test_benchmarks_timing.py
and the search's GPU tests.
"""

from __future__ import annotations

import ctypes
import threading
import types

import pytest

from pycudnn.runtime import gate as G
from pycudnn.engines import graph


class _Runtime:
    """Counts events; a run of the search's timing loop needs no more than these calls."""

    def __init__(self, fail_event_at: int | None = None) -> None:
        self.created = self.destroyed = 0
        self.fail_event_at = fail_event_at

    def cudaEventCreate(self):
        if self.fail_event_at is not None and self.created == self.fail_event_at:
            return 2, None  # cudaErrorMemoryAllocation
        self.created += 1
        return 0, object()

    def cudaEventDestroy(self, ev):
        self.destroyed += 1

    def cudaEventRecord(self, ev, s):
        return (0,)

    def cudaEventSynchronize(self, ev):
        return (0,)

    def cudaEventElapsedTime(self, a, b):
        return 0, 1.0


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


def _round(rt, gate, runs=()):
    search = types.SimpleNamespace(_rt=lambda: rt)
    args = types.SimpleNamespace(stream=0x1234, handle=0)
    return graph.GraphEngine._gated_round(search, args, gate, list(runs), (), 0)


def test_a_watchdog_that_cannot_start_still_opens_the_hold_and_frees_the_events():
    rt, gate = _Runtime(), _Gate(watchdog_fails=True)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        _round(rt, gate)
    assert gate.held == [0x1234]
    assert gate.opened == [1]
    assert rt.created == rt.destroyed == 1


def test_an_interrupt_while_queuing_opens_the_hold():
    rt, gate = _Runtime(), _Gate()
    runs = [(types.SimpleNamespace(plan=_Plan(fail=True)), 3)]
    with pytest.raises(KeyboardInterrupt):
        _round(rt, gate, runs)
    assert gate.opened == [1]
    assert rt.created == rt.destroyed == 2


def test_an_event_that_cannot_be_made_queues_no_hold_and_frees_the_others():
    rt, gate = _Runtime(fail_event_at=1), _Gate()
    runs = [(types.SimpleNamespace(plan=_Plan(fail=False)), 1)]
    with pytest.raises(Exception, match="cudaEventCreate"):
        _round(rt, gate, runs)
    assert gate.held == [] and gate.opened == []
    assert rt.created == rt.destroyed == 1


def test_a_successful_round_opens_once_and_times_each_candidate():
    rt, gate = _Runtime(), _Gate()
    runs = [(types.SimpleNamespace(plan=_Plan(fail=False)), 4),
            (types.SimpleNamespace(plan=_Plan(fail=False)), 2)]
    assert _round(rt, gate, runs) == [0.25, 0.5]
    assert gate.opened == [1]
    assert rt.created == rt.destroyed == 3


def _host_gate() -> G.StreamGate:
    """A StreamGate whose word lives in host memory and whose driver call is a recorder."""
    gate = object.__new__(G.StreamGate)
    gate._buf = ctypes.c_uint32(0)
    gate._word = gate._buf
    gate._generation = 0
    gate._lock = threading.Lock()
    gate._dptr, gate._geq = 0, 0
    gate.opened_by_watchdog = 0
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

    monkeypatch.setattr(threading.Timer, "start", no_thread)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        gate.watchdog(3)
    assert gate._word.value == 3
