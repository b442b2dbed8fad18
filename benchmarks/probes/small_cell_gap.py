"""Probe (not a benchmark): is pycudnn's kernel time on a small convolution PyTorch's?

``conv_vs_torch.py`` at 3860841 (and at 60f46db) times the small bf16 1x1 cells of ResNet-50
about 1.2 us slower on pycudnn's side than PyTorch's (layer1.0.conv1 forward: 8.4 against
7.2 us, the same kernel names), while the same call timed here, with the same gate and batches,
gives PyTorch's time. This times that layer's forward (bf16 NHWC, 32x64x56x56, 64 1x1 filters)
behind ``gpu_timing.Gate``, 100 calls a batch, six rounds: PyTorch; pycudnn allocating its
output, with ``out=``, with each output kept alive (no block reused), called as
``conv_vs_torch.py`` calls it (geometry keywords, ``engine="graph"``, a torch stream object), and
the kept-block pool after. Then the same two calls through ``gpu_timing.compare_gated`` (as
``conv_vs_torch.py`` times a cell: warm-up, sides alternating) and through ``conv_vs_torch.py``'s
own ``_calls`` and ``measure_cell`` on this layer, at its full and quick settings, so that one
run tells which step brings the gap. Run:

    PYTHONPATH=. python3 benchmarks/probes/small_cell_gap.py

Result (H200, 164391b; `benchmarks/results/2026-12-04/small_cell_gap_164391b.txt`): every
pycudnn column within 0.05 us of PyTorch's (7.05-7.09 us), so the gap is in what
``conv_vs_torch.py`` does around the calls, not in the call. The lines V1-V8 (at 782d76a,
`small_cell_gap_782d76a.txt`) change one thing at a time: ``_calls``'s own lambdas bring the gap
(8.36 against 7.06 us on the same tensors): they pass the geometry as lists, which made every
such call take the full path, whose output came from a stream-ordered allocation (fixed in
b1979d5 and 943c6d8; `alloc_between_kernels.py` times the allocation alone).
"""
import statistics
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gpu_timing  # noqa: E402
import pycudnn  # noqa: E402
import small_cell  # noqa: E402 - this probe's folder
from pycudnn.runtime.memory import pool, resolve_stream  # noqa: E402

torch.backends.cudnn.benchmark = True
cl = torch.channels_last
x, w, out = small_cell.tensors()
cs = torch.cuda.current_stream()
kw = dict(benchmark=True, tuning_db=False, stream=0)
keep: list = []
fns = {"torch": lambda: F.conv2d(x, w),
       "pycudnn alloc": lambda: pycudnn.convolution(x, w, **kw),
       "pycudnn out=": lambda: pycudnn.convolution(x, w, out=out, **kw),
       "pycudnn alloc, kept alive": lambda: keep.append(pycudnn.convolution(x, w, **kw)),
       "torch, kept alive": lambda: keep.append(F.conv2d(x, w)),
       "pycudnn as conv_vs_torch calls it": lambda: pycudnn.convolution(
           x, w, stream=cs, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
           benchmark=True, allow_tf32=True, engine="graph", tuning_db=False),
       "pycudnn stream=torch stream": lambda: pycudnn.convolution(x, w, stream=cs, benchmark=True,
                                                                  tuning_db=False)}
for f in fns.values():
    f()
    torch.cuda.synchronize()
keep.clear()
gate = gpu_timing.Gate(torch=torch)
res: dict[str, list[float]] = {k: [] for k in fns}
for _ in range(6):
    for k, f in fns.items():
        res[k].append(gpu_timing.gated_batch_us(f, 0, 100, gate))
        keep.clear()
        torch.cuda.synchronize()
for k, v in res.items():
    print(f"{k}: {statistics.median(v):.2f} us")
print("the torch stream resolved to", resolve_stream(cs))
print("kept blocks", {k: len(v) for k, v in pool.blocks.items()})
entry = pycudnn.benchmark_cache()[0]
print(entry["choice"][:200], "workspace", entry["workspace"])

import argparse  # noqa: E402

import conv_vs_torch  # noqa: E402

pair = {"torch": fns["torch"], "pycudnn": fns["pycudnn as conv_vs_torch calls it"]}
for reps, batches in ((100, 6), (40, 4)):
    got = gpu_timing.compare_gated(pair, 0, reps, batches, gate=gate, synchronize=torch.cuda.synchronize)
    print(f"compare_gated, {reps} reps x {batches}: " + ", ".join(
        f"{k} {statistics.median(v):.2f} us" for k, v in got.items()))
layer = conv_vs_torch.select_layers(conv_vs_torch.resnet50_layers(32), "layer1.0.conv1")[0]
xs = torch.randn(layer.x_shape, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
ws = (torch.randn(layer.w_shape, device="cuda", dtype=torch.bfloat16) * 0.05).to(memory_format=cl)
dys = torch.randn(layer.y_shape, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
flags = {"benchmark": True, "allow_tf32": True, "engine": "graph", "tuning_db": False}
for reps, batches in ((100, 6), (40, 4)):
    for first in ("torch", "pycudnn"):
        tfn, pfn = conv_vs_torch._calls(torch, F, pycudnn, layer, "fwd", xs, ws, dys, flags,
                                        torch.cuda.current_stream())
        row = {"gflop": layer.flops / 1e9}
        ns = argparse.Namespace(reps=reps, batches=batches, no_kernel_names=True)
        conv_vs_torch.measure_cell(torch, pycudnn, row, tfn, pfn, ns, gate, first)
        print(f"measure_cell, {reps} reps x {batches}, {first} first: torch {row.get('torch_us', 0):.2f} us, "
              f"pycudnn {row.get('pycudnn_us', 0):.2f} us {row.get('error', '')}")


# ---- which step of measure_cell brings the gap: one change at a time ------------------------------
def grids(fn):
    """(kernel name tail, grid, block) of one call's kernels, from a torch.profiler trace."""
    fn()
    torch.cuda.synchronize()
    trace = gpu_timing._profile_trace(torch, fn)
    return [(e["name"][-60:], e.get("args", {}).get("grid"), e.get("args", {}).get("block"))
            for e in trace["traceEvents"] if e.get("cat") == "kernel"]


def pair_on(xt, wt, dyt):
    tfn, pfn = conv_vs_torch._calls(torch, F, pycudnn, layer, "fwd", xt, wt, dyt, flags,
                                    torch.cuda.current_stream())
    return {"torch": tfn, "pycudnn": pfn}


def line(label, got):
    print(f"{label}: " + ", ".join(f"{k} {statistics.median(v):.2f} us" for k, v in got.items()),
          flush=True)


print("pointers mod 4096: x", x.data_ptr() % 4096, "w", w.data_ptr() % 4096, "xs",
      xs.data_ptr() % 4096, "ws", ws.data_ptr() % 4096)
print("cache entries", len(pycudnn.benchmark_cache()))
line("V1 compare_gated, probe lambdas, x/w", gpu_timing.compare_gated(
    pair, 0, 100, 6, gate=gate, synchronize=torch.cuda.synchronize))
line("V2 compare_gated, _calls lambdas, x/w", gpu_timing.compare_gated(
    pair_on(x, w, dys), 0, 100, 6, gate=gate, synchronize=torch.cuda.synchronize))
line("V3 compare_gated, _calls lambdas, xs/ws", gpu_timing.compare_gated(
    pair_on(xs, ws, dys), 0, 100, 6, gate=gate, synchronize=torch.cuda.synchronize))
line("V4 compare_gated, _calls lambdas, xs/w", gpu_timing.compare_gated(
    pair_on(xs, w, dys), 0, 100, 6, gate=gate, synchronize=torch.cuda.synchronize))
line("V5 compare_gated, _calls lambdas, x/ws", gpu_timing.compare_gated(
    pair_on(x, ws, dys), 0, 100, 6, gate=gate, synchronize=torch.cuda.synchronize))
w_scaled = w * 0.05
line("V6 compare_gated, _calls lambdas, x/(w*0.05)", gpu_timing.compare_gated(
    pair_on(x, w_scaled, dys), 0, 100, 6, gate=gate, synchronize=torch.cuda.synchronize))
ws_unscaled = torch.randn(layer.w_shape, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
line("V7 compare_gated, _calls lambdas, xs/fresh unscaled w", gpu_timing.compare_gated(
    pair_on(xs, ws_unscaled, dys), 0, 100, 6, gate=gate, synchronize=torch.cuda.synchronize))
zero_w = torch.zeros_like(ws)
line("V8 compare_gated, _calls lambdas, xs/zero w", gpu_timing.compare_gated(
    pair_on(xs, zero_w, dys), 0, 100, 6, gate=gate, synchronize=torch.cuda.synchronize))
print("cache entries", len(pycudnn.benchmark_cache()))
for e in pycudnn.benchmark_cache():
    print("  ", e["direction"], e["choice"][:120], "workspace", e["workspace"])
for label, (xt, wt) in {"x/w": (x, w), "xs/ws": (xs, ws)}.items():
    p_ = pair_on(xt, wt, dys)
    print("grids", label, "torch", grids(p_["torch"]), "pycudnn", grids(p_["pycudnn"]), flush=True)
