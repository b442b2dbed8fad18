"""Probe (not a benchmark): which allocation puts GPU time between back-to-back small
convolutions (bf16 NHWC 32x64x56x56, 64 1x1 filters, 100 calls a gated batch, five rounds).

On the legacy stream: PyTorch; pycudnn's remembered call (geometry as tuples), its full path
(geometry as lists, before 943c6d8 never remembered), each with ``out=``; PyTorch's call
followed by an ``allocate()`` and by an ``allocate_fast()`` dropped at once. Then the same on a
non-blocking side stream. Run:

    PYTHONPATH=. python3 benchmarks/probes/alloc_between_kernels.py

Results (H200): ``benchmarks/results/2026-12-04/alloc_probe_782d76a.txt`` (before; the side
stream part did not run) and ``alloc_probe_943c6d8.txt``: a stream-ordered allocate and free
costs 1.2-1.4 us a call, a kept block nothing; at 943c6d8 every legacy-stream column is
PyTorch's, and on a side stream pycudnn's call without ``out=`` is 8.62 us against 7.31.
"""
import statistics, sys
sys.path.insert(0, "benchmarks")
import torch
import torch.nn.functional as F
import gpu_timing
import pycudnn
from pycudnn.runtime.memory import allocate
from pycudnn.runtime.memory.stream_allocation import allocate_fast
import small_cell  # this probe's folder

torch.backends.cudnn.benchmark = True
x, w, out = small_cell.tensors()
from cuda.bindings import runtime as _crt
_err, _h = _crt.cudaStreamCreateWithFlags(_crt.cudaStreamNonBlocking)
side = torch.cuda.ExternalStream(int(_h))
kw = dict(benchmark=True, tuning_db=False)
N = small_cell.NBYTES
def on(s, f):
    def g():
        with torch.cuda.stream(s):
            return f()
    return g
cases = {
    "torch legacy": lambda: F.conv2d(x, w),
    "pycudnn tuple (hot path)": lambda: pycudnn.convolution(x, w, stride=(1, 1), **kw),
    "pycudnn list (full path)": lambda: pycudnn.convolution(x, w, stride=[1, 1], **kw),
    "pycudnn list, out=": lambda: pycudnn.convolution(x, w, stride=[1, 1], out=out, **kw),
    "pycudnn tuple, out=": lambda: pycudnn.convolution(x, w, stride=(1, 1), out=out, **kw),
    "torch + allocate()/free": lambda: (F.conv2d(x, w), allocate(N, 0, 0)),
    "torch + allocate_fast()/free": lambda: (F.conv2d(x, w), allocate_fast(N, 0, 0)),
}
sh = side.cuda_stream
side_cases = {
    "torch side stream": on(side, lambda: F.conv2d(x, w)),
    "pycudnn tuple side stream": on(side, lambda: pycudnn.convolution(x, w, stride=(1, 1), stream=side, **kw)),
    "pycudnn tuple side stream, out=": on(side, lambda: pycudnn.convolution(x, w, stride=(1, 1), stream=side, out=out, **kw)),
    "pycudnn side stream as int": on(side, lambda: pycudnn.convolution(x, w, stride=(1, 1), stream=sh, **kw)),
    "pycudnn list side stream": on(side, lambda: pycudnn.convolution(x, w, stride=[1, 1], stream=side, **kw)),
    "torch side + allocate(side)": on(side, lambda: (F.conv2d(x, w), allocate(N, 0, side))),
    "torch side + allocate_fast(side)": on(side, lambda: (F.conv2d(x, w), allocate_fast(N, 0, sh, side))),
}
gate = gpu_timing.Gate(torch=torch)
for group, stream in ((cases, 0), (side_cases, sh)):
    for f in group.values():
        f(); f()
    torch.cuda.synchronize()
    res = {k: [] for k in group}
    for _ in range(5):
        for k, f in group.items():
            if res[k] is None:
                continue
            try:
                res[k].append(gpu_timing.gated_batch_us(f, stream, 100, gate))
            except Exception as exc:
                print(k, "failed:", exc, flush=True)
                res[k] = None
            torch.cuda.synchronize()
    for k, v in res.items():
        if v:
            print(f"{k}: {statistics.median(v):.2f} us", flush=True)
