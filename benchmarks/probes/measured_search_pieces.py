"""Probe (not a benchmark): where a measured search of a further new shape spends its time, and
what fewer timing rounds would cost in the choice.

For the first-result part's further shapes of ``vs_frontend.py`` (bf16 NHWC 3x3, batch 32), one
process, the first shape searched before (kernels and libraries loaded): each shape's
``benchmark=True`` first call, wall ms, with the pieces timed by ``perf_counter`` wrappers (no
cProfile): graph build, heuristics query, describing, finalizing, the timing (its warm-up pass
and gated rounds apart), the tuning database's store. Then the same shapes with other timing
settings (``_ROUNDS``, ``_GATED_SPAN_MS``, ``PRUNE_FACTOR`` of ``pycudnn.engines.graph``), each
setting's chosen plan and its kernel time (CUDA events, 200 runs queued behind a sleep kernel) against the
default setting's choice. Run:

    PYTHONPATH=. python3 benchmarks/probes/measured_search_pieces.py
"""
import statistics
import time
from collections import defaultdict

import torch

import pycudnn
from pycudnn.cudnn.graph import build as B
from pycudnn.cudnn.graph import plan as P
from pycudnn.engines import graph as G
from pycudnn.api import call as C
from pycudnn.tuning import db as DB

SHAPES = [(32, 64, 56, 64), (32, 128, 28, 128), (32, 256, 14, 256), (32, 512, 7, 512),
          (32, 96, 40, 96), (32, 192, 20, 192), (32, 320, 10, 320)]
spent: dict[str, float] = defaultdict(float)
counts: dict[str, int] = defaultdict(int)


def timed(owner, name, label):
    real = getattr(owner, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            spent[label] += time.perf_counter() - t0
            counts[label] += 1
    setattr(owner, name, wrapper)


timed(G, "build_convolution_graph", "graph built")
timed(P.LazyCandidates, "_query", "heuristics queried")
timed(P, "_describe", "configs described")
timed(P.ExecutionPlan, "finalize", "plans finalized")
timed(G.GraphEngine, "_time_all", "timing (_time_all)")
timed(G.GraphEngine, "gated_round", "  gated rounds")
timed(G, "stream_synchronize", "  warm-up pass sync")
timed(DB, "store", "tuning db store")
timed(G, "event_create", "    events created")
timed(G, "event_destroy", "    events destroyed")
timed(G, "event_synchronize", "    event synchronize (GPU runs the batch)")
timed(P.ExecutionPlan, "execute", "    plan executes")
from pycudnn.runtime import gate as GT
timed(GT.StreamGate, "hold", "    gate hold (with its watchdog thread)")
timed(GT.StreamGate, "open", "    gate open")
timed(C, "try_all", "whole search (try_all)")


def layer(shape):
    n, c, h, k = shape
    x = torch.randn(n, c, h, h, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = torch.randn(k, c, 3, 3, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    return x, w


def kernel_ms(plan_call, runs=200):
    for _ in range(10):
        plan_call()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(40_000_000)  # the GPU held while the runs are queued: no launch gaps timed
    s.record()
    for _ in range(runs):
        plan_call()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / runs


layers = [layer(s) for s in SHAPES]
stream = torch.cuda.current_stream()
x, w = layers[0]
pycudnn.convolution(x, w, padding=1, benchmark=True, stream=stream)
torch.cuda.synchronize()
# the default first, twice: its first pass loads the candidates' kernels (CUDA's lazy loading)
SETTINGS = [("default (kernels loading)", {}), ("default", {}), ("rounds 3, prune 1.5", {"_ROUNDS": 3, "PRUNE_FACTOR": 1.5}),
            ("rounds 1", {"_ROUNDS": 1}), ("span 0.05 ms", {"_GATED_SPAN_MS": 0.05})]
defaults = {k: getattr(G, k) for k in ("_ROUNDS", "_GATED_SPAN_MS", "PRUNE_FACTOR")}
choices: dict[str, list] = {}
for name, change in SETTINGS:
    for k, v in defaults.items():
        setattr(G, k, change.get(k, v))
    walls = []
    spent.clear()
    counts.clear()
    chosen = []
    for x, w in layers[1:]:
        pycudnn.clear_caches()
        DB.clear()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pycudnn.convolution(x, w, padding=1, benchmark=True, stream=stream)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
        p = pycudnn.prepare_convolution(x, w, padding=1, benchmark=True)
        chosen.append((p.record.plan.tag, p))
    choices[name] = chosen
    n = len(walls)
    print(f"\n## {name}: wall ms per further shape {', '.join(f'{t:.1f}' for t in walls)} "
          f"(median {statistics.median(walls):.1f})")
    for label in sorted(spent, key=lambda s: -spent[s]):
        print(f"  {label}: {spent[label] * 1e3 / n:.2f} ms per shape, {counts[label] / n:.1f} calls")
for k, v in defaults.items():
    setattr(G, k, v)
print("\n## chosen plans: kernel us (CUDA events, 200 runs), ratio to the default's choice")
for i, shape in enumerate(SHAPES[1:]):
    x, w = layers[i + 1]
    us = {name: kernel_ms(lambda p=choices[name][i][1]: p(x, w)) * 1e3 for name, _ in SETTINGS}
    print(f"{shape}: " + " | ".join(f"{name}: {choices[name][i][0]} {us[name]:.1f} "
                                    f"({us[name] / us['default']:.3f})" for name, _ in SETTINGS))
