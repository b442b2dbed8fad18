"""Probe (not a benchmark; no GPU needed): the host cost of one gated batch's hold, its watch,
its open and the watch's cancel, as the measured search and routing's timing pay it per batch.

The gate's word lives in host memory here and the driver's stream wait is a no-op, so this
times only the host side: the lock, the deadline and the watchdog's thread.

    PYTHONPATH=. python3 benchmarks/probes/gate_hold_cost.py
"""
import ctypes
import time
import types

from pycudnn.runtime import gate as G

gate = object.__new__(G.StreamGate)
gate._buf = ctypes.c_uint32(0)
gate._word = gate._buf
gate._init_watchdog()
gate._dptr, gate._geq = 0, 0
gate._drv = types.SimpleNamespace(cuStreamWaitValue32=lambda *a: 0)


def cycle() -> None:
    g = gate.hold(1)
    w = gate.watchdog(g)
    gate.open(g)
    w.cancel()


for _ in range(50):
    cycle()
n = 2000
t0 = time.perf_counter()
for _ in range(n):
    cycle()
print(f"hold + watchdog + open + cancel: {(time.perf_counter() - t0) / n * 1e6:.1f} us a batch")
