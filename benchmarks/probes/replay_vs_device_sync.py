"""Probe (not a benchmark): while pycudnn captures a repeated launch into a CUDA graph (graph
replay, `pycudnn.runtime.memory.replay`), does a device-wide synchronize on another thread fail?

One thread calls ``torch.cuda.synchronize()`` in a loop while the main thread makes tiny
convolutions with ``out=`` (each key repeats four times, so replay captures it; the caches are
cleared every ten keys so captures keep happening). Prints the synchronize errors by message
and the replay statistics before and after.

Result (H200, cuDNN 9.19, at 73acf12 where replay was on by default;
`benchmarks/results/2026-12-04/replay_probes.txt`): 82 of 49,445 synchronize calls failed with
"operation not permitted when stream is capturing", and all 30 captures were given up. CUDA
refuses a device-wide synchronize while any stream of the device captures, whatever the capture
mode, so replay is off unless ``PYCUDNN_GRAPH_REPLAY=1``. Run:

    PYCUDNN_GRAPH_REPLAY=1 PYTHONPATH=. python3 benchmarks/probes/replay_vs_device_sync.py
"""
import threading
import torch
import pycudnn
from pycudnn.runtime.memory import driver as D, replay
drv = D.driver()
torch.zeros(1, device="cuda")
x = torch.randn(1, 8, 8, 8, device="cuda"); w = torch.randn(8, 8, 3, 3, device="cuda")
stop = False
errs = {}
def syncer():
    torch.cuda.set_device(0)
    torch.cuda.synchronize()
    n = 0
    while not stop:
        n += 1
        try:
            torch.cuda.synchronize()
        except Exception as exc:
            errs[str(exc)[:80]] = errs.get(str(exc)[:80], 0) + 1
    errs["syncs"] = n
t = threading.Thread(target=syncer); t.start()
built0 = replay.stats()
for i in range(300):
    y = torch.empty(1, 8, 8, 8, device="cuda")
    pycudnn.clear_caches() if i % 10 == 0 else None
    for _ in range(4):
        pycudnn.convolution(x, w, padding=1, out=y)
stop = True; t.join()
print("sync errors:", errs, "replay", built0, replay.stats())
