"""Probe (not a benchmark): where a converted ResNet-50's extra host time per training step
comes from, when every convolution is routed to PyTorch's.

``train_host_profile.py`` at e01df8d: host-issue 18.2-22.9 ms a step converted against
15.1-19.5 ms plain (batch 64, bf16 channels_last), the GPU's own time no longer. This times
host-issue per step (20 steps, five alternating rounds, medians) of: the plain model; the
converted one; the converted one after `pycudnn.torch.revert` (plain modules, after pycudnn ran:
anything global pycudnn left behind shows here); each again with the garbage collector off; and
the seconds in autograd's backward per step of each side under cProfile; then the threads alive.

    PYTHONPATH=. python3 benchmarks/probes/convert_host_gap.py
"""
import copy
import cProfile
import gc
import os
import pstats
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))  # run from the project root
import torch  # noqa: E402

import resnet50 as rb  # noqa: E402
import pycudnn.torch as pt  # noqa: E402

torch.backends.cudnn.benchmark = True
base = rb.make_model()
data = rb.make_data(64, 4)
sides = {"plain": copy.deepcopy(base), "converted": rb.pycudnn_side(copy.deepcopy(base)),
         "reverted": rb.pycudnn_side(copy.deepcopy(base))}
opts = {k: rb.sgd(m) for k, m in sides.items()}
for name, m in sides.items():
    for i in range(12):
        rb.train_step(m, opts[name], *data[i % 4])
torch.cuda.synchronize()
pt.revert(sides["reverted"])
print("routed:", sum(d["winner"] == "torch" for d in pt.routing_report()), "to torch of",
      len(pt.routing_report()), flush=True)


def host_ms(name: str, n: int = 20) -> float:
    m, o = sides[name], opts[name]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        rb.train_step(m, o, *data[i % 4])
    host = (time.perf_counter() - t0) / n * 1e3
    torch.cuda.synchronize()
    return host


for gc_on in (True, False):
    if not gc_on:
        gc.collect()
        gc.disable()
    res: dict = {k: [] for k in sides}
    for _ in range(5):
        for k in sides:
            res[k].append(host_ms(k))
    gc.enable()
    print(f"gc {'on ' if gc_on else 'off'}: " + ", ".join(
        f"{k} {statistics.median(v):.2f} ms" for k, v in res.items()) + " host-issue a step",
        flush=True)

for k in ("plain", "converted"):
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    host_ms(k)
    prof.disable()
    st = pstats.Stats(prof)
    back = [v for f, v in st.stats.items() if f[2] == "<method 'run_backward' of 'torch._C._EngineBase' objects>"]
    print(f"{k}: run_backward {back[0][2] / 20 * 1e3:.2f} ms a step (profiled)" if back else
          f"{k}: no run_backward entry", flush=True)
print("threads:", [(t.name, t.daemon, getattr(getattr(t, "_target", None), "__qualname__", None))
                   for t in threading.enumerate()])
