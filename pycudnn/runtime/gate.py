"""A gate that holds a stream on the GPU until the host has queued everything behind it.

Timing a ~10 us kernel by launching it from Python measures the launch as much as the kernel:
the GPU waits for the host between launches. With the stream held on a GPU-side wait
(``cuStreamWaitValue32`` on a 4-byte word of host-mapped memory, through the driver by ctypes)
the host queues every run and its events first, then writes the word, and the GPU runs the
queue back to back: the events then time the kernels alone. The search uses this to rank
candidate plans.

Each hold waits for a new generation of the word (greater-or-equal), so a late write for an
earlier hold never opens a later one. A watchdog (one thread per gate), given each hold's
deadline before the wait is queued, opens a hold the host failed to open in time (a launch that
blocked because the queue was full, an interrupt before the caller kept the generation): the
GPU can never stay held.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
import weakref

from .memory import check_driver
from .memory import driver as _driver
from .memory.devices import require_driver
from .memory.streams import (event_create, event_destroy, event_query, event_record,
                             event_synchronize)

__all__ = ["StreamGate", "Watch", "gate_for", "MAX_QUEUED"]

log = logging.getLogger("pycudnn")

#: launches queued behind one hold at most: the driver's queue holds ~1024 before a launch
#: blocks the host (which would then never open the gate itself)
MAX_QUEUED = 256
#: seconds after which the watchdog opens a hold. A hold can be stuck when another thread loads
#: a kernel module meanwhile (CUDA's lazy loading may wait for the held stream while this thread
#: waits for the loader): then only the runs queued late include launch gaps.
WATCHDOG_S = 0.2


class Watch:
    """What `StreamGate.watchdog` returns: `cancel()` forgets the hold's deadline without opening
    it (`StreamGate.open` forgets it too; cancelling after that is harmless)."""

    __slots__ = ("_gate", "generation")

    def __init__(self, gate: StreamGate | None, generation: int) -> None:
        self._gate, self.generation = gate, generation

    def cancel(self) -> None:
        if self._gate is not None:
            self._gate._forget(self.generation)


class StreamGate:
    """Holds streams of one device on a host-mapped word; see the module docstring."""

    def __init__(self, device: int) -> None:
        drv = self._drv = require_driver("cuMemHostAlloc")
        self.device = device
        host = ctypes.c_void_p()
        check_driver(drv.cuMemHostAlloc(ctypes.byref(host), 4, _driver.MEMHOSTALLOC_DEVICEMAP
                                        | _driver.MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc(mapped)")
        self._host = int(host.value or 0)
        self._word = ctypes.c_uint32.from_address(self._host)
        self._word.value = 0
        dptr = ctypes.c_uint64()
        check_driver(drv.cuMemHostGetDevicePointer(ctypes.byref(dptr), self._host, 0),
                     "cuMemHostGetDevicePointer")
        self._dptr = int(dptr.value)
        self._geq = _driver.STREAM_WAIT_VALUE_GEQ
        self._init_watchdog()

    def _init_watchdog(self) -> None:
        self._generation = 0
        self.opened_by_watchdog = 0
        self._new_watchdog()
        _gates_made.add(self)

    def _new_watchdog(self) -> None:
        """A fresh lock, wake-up and deadline table, no thread yet (also in a forked child: the
        parent's watchdog thread may have held the lock at the fork, and is gone)."""
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # generation -> the monotonic time its watchdog opens it; one thread watches them all
        # (a thread started per hold cost ~200 us of each gated batch)
        self._deadlines: dict[int, float] = {}
        self._thread: threading.Thread | None = None

    def hold(self, stream: int) -> int:
        """Queue a hold on ``stream``; returns the generation `open` takes. Its deadline is set
        first (`watchdog`), so the hold is opened after `WATCHDOG_S` even when the caller never
        gets the generation.

        Raises:
            RuntimeError: the watchdog's thread cannot start (nothing is queued then), or the
                driver refused.
        """
        with self._lock:
            self._generation += 1
            g = self._generation
        self._arm(g)
        try:
            err = self._drv.cuStreamWaitValue32(stream, self._dptr, g & 0xFFFFFFFF, self._geq)
            if err:
                check_driver(err, "cuStreamWaitValue32")
        except BaseException:
            # the wait may be queued although the call did not return (an interrupt): open it,
            # since the caller never learns the generation to open
            self.open(g)
            raise
        return g

    def open(self, generation: int) -> None:
        """Let held streams go on past ``generation`` (and every earlier hold); their deadlines
        are forgotten."""
        with self._lock:
            if generation > self._word.value:
                self._word.value = generation & 0xFFFFFFFF
            for g in [g for g in self._deadlines if g <= generation]:
                del self._deadlines[g]

    def _forget(self, generation: int) -> None:
        with self._lock:
            self._deadlines.pop(generation, None)

    def _arm(self, generation: int) -> None:
        """Set the deadline of ``generation`` and make sure the watchdog's thread runs
        (RuntimeError where it cannot start: the deadline is not kept then)."""
        with self._lock:
            self._deadlines[generation] = time.monotonic() + WATCHDOG_S
            thread = self._thread
            if thread is None or not thread.is_alive():  # first hold, or after a fork
                thread = threading.Thread(target=self._watch, name="pycudnn-gate-watchdog",
                                          daemon=True)
                try:
                    thread.start()
                except BaseException:
                    self._deadlines.pop(generation, None)
                    raise
                self._thread = thread
            else:
                self._wake.notify()

    def _watch(self) -> None:
        """The watchdog's thread: opens each hold whose deadline passed."""
        while True:
            with self._lock:
                now = time.monotonic()
                due = [g for g, t in self._deadlines.items() if t <= now]
                if not due:
                    wait = min(self._deadlines.values(), default=now + 3600.0) - now
                    self._wake.wait(max(wait, 0.001))
                    continue
            for g in due:
                self._fire(g)

    def _fire(self, generation: int) -> None:
        if self._word.value < generation:
            self.opened_by_watchdog += 1
            log.info("gated timing: a hold was opened by the watchdog after %.1f s", WATCHDOG_S)
        self.open(generation)

    def watchdog(self, generation: int) -> Watch:
        """The watch on ``generation`` that opens it after `WATCHDOG_S` (the deadline `hold`
        set, or a new one); cancelling it is harmless, `open` forgets it too."""
        with self._lock:
            armed = generation in self._deadlines
            opened = generation <= self._word.value
        if armed:
            return Watch(self, generation)
        if opened:
            return Watch(None, generation)  # nothing to open
        try:
            self._arm(generation)
        except BaseException:
            # no thread (e.g. "can't start new thread"): nobody would open a hold the caller
            # fails to open, so open it now; the caller's finally opens it too (harmless)
            self.open(generation)
            raise
        return Watch(self, generation)

    def self_test(self) -> None:
        """Raise unless a hold really holds a stream and an open really lets it go."""
        drv = self._drv
        out = ctypes.c_void_p()
        check_driver(drv.cuStreamCreate(ctypes.byref(out), _driver.STREAM_NON_BLOCKING),
                     "cuStreamCreate")
        stream = int(out.value or 0)
        ev = 0
        try:
            ev = event_create(timing=False)
            g = self.hold(stream)
            event_record(ev, stream)
            time.sleep(0.002)
            held = not event_query(ev)
            self.open(g)
            event_synchronize(ev)
            if not held:
                raise RuntimeError("the stream did not wait for the word")
        finally:
            event_destroy(ev)
            drv.cuStreamDestroy(stream)


_gates: dict[int, StreamGate | None] = {}
_gates_lock = threading.Lock()
#: every gate made, for the fork handler below
_gates_made: weakref.WeakSet[StreamGate] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for gate in list(_gates_made):
        gate._new_watchdog()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def gate_for(device: int) -> StreamGate | None:
    """The device's gate (made and checked once per process), or None where the GPU cannot
    wait on a host-mapped word (the search then times launches back to back, as before)."""
    try:
        return _gates[device]
    except KeyError:
        pass
    with _gates_lock:
        if device not in _gates:
            gate: StreamGate | None
            try:
                gate = StreamGate(device)
                gate.self_test()
            except Exception as exc:  # noqa: BLE001 - reported; the ungated timing still works
                log.info("gated timing unavailable on device %d (%s: %s); timing launches back "
                         "to back", device, type(exc).__name__, exc)
                gate = None
            _gates[device] = gate
        return _gates[device]
