"""Where the host time of a converted ResNet-50 training step goes: host-issue and end-to-end
time per step of both sides, the GPU's own time per step (the stream held by a sleep kernel),
a cProfile of 20 pycudnn steps, and the host cost of one layer's forward (+ backward).

    PYTHONPATH=. python3 benchmarks/probes/train_host_profile.py head            # this checkout
    PYTHONPATH=<old checkout> python3 benchmarks/probes/train_host_profile.py old

Run from the project root (it imports benchmarks/resnet50.py). Results of 2026-12-01 (commit
d0ab280 against 1802168, the commit README's 1.005x was measured at):
benchmarks/results/2026-12-01/probe_train_host_profile.txt.
"""
import cProfile
import copy
import io
import os
import pstats
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))  # run from the project root
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import resnet50 as rb  # noqa: E402

torch.backends.cudnn.benchmark = True
out = os.environ.get("OUT", "/tmp")
tag = sys.argv[1] if len(sys.argv) > 1 else "head"

base = rb.make_model()
data = rb.make_data(64, 4)
sides = {"torch": copy.deepcopy(base), "pycudnn": rb.pycudnn_side(copy.deepcopy(base))}
opts = {k: rb.sgd(m) for k, m in sides.items()}
for name, m in sides.items():
    for i in range(12):
        rb.train_step(m, opts[name], *data[i % 4])
torch.cuda.synchronize()
print(tag, "threads:", [t.name for t in threading.enumerate()], flush=True)


def steps(name, n):
    m, o = sides[name], opts[name]
    for i in range(n):
        rb.train_step(m, o, *data[i % 4])


def host_and_step(name, n=20):
    """(host s per step with the GPU never waited on, s per step end to end)"""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    steps(name, n)
    host = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    total = (time.perf_counter() - t0) / n
    return host, total


for rep in range(3):
    for name in sides:
        h, t = host_and_step(name)
        print(f"{tag} {name:8} host-issue {h*1e3:6.2f} ms/step, end-to-end {t*1e3:6.2f} ms/step "
              f"({1/t:6.1f} steps/s)", flush=True)

# the GPU's own time per step: a CUDA graph-free estimate through a long sleep gate
torch.cuda.synchronize()
for name in sides:
    torch.cuda._sleep(int(2e9))  # ~1 s at H200 clocks: the host queues every launch first
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    steps(name, 10)
    e1.record()
    e1.synchronize()
    print(f"{tag} {name:8} GPU-held {e0.elapsed_time(e1)/10:6.2f} ms/step (incl. part of sleep)",
          flush=True)

prof = cProfile.Profile()
torch.cuda.synchronize()
prof.enable()
steps("pycudnn", 20)
torch.cuda.synchronize()
prof.disable()
s = io.StringIO()
st = pstats.Stats(prof, stream=s)
st.sort_stats("tottime").print_stats(35)
st.sort_stats("cumulative").print_stats(45)
with open(f"{out}/prof_{tag}.txt", "w") as f:
    f.write(s.getvalue())
print(s.getvalue()[:6000])

# per-layer micro: host us of fwd+bwd on a real layer shape, torch vs pycudnn
import pycudnn.torch as pt  # noqa: E402,I001

x = torch.randn(64, 256, 14, 14, device="cuda", dtype=torch.bfloat16).to(
    memory_format=torch.channels_last).requires_grad_(True)
w = torch.randn(256, 256, 3, 3, device="cuda", dtype=torch.bfloat16).to(
    memory_format=torch.channels_last).requires_grad_(True)
g = torch.randn(64, 256, 14, 14, device="cuda", dtype=torch.bfloat16).to(
    memory_format=torch.channels_last)
for label, fn in (("torch", lambda: F.conv2d(x, w, padding=1).backward(g)),
                  ("pycudnn", lambda: pt.conv2d(x, w, padding=1).backward(g)),
                  ("torch-fwd", lambda: F.conv2d(x.detach(), w.detach(), padding=1)),
                  ("pycudnn-fwd", lambda: pt.conv2d(x.detach(), w.detach(), padding=1))):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        torch.cuda._sleep(int(3e8))
        t0 = time.perf_counter()
        for _ in range(100):
            fn()
        samples.append((time.perf_counter() - t0) / 100 * 1e6)
        torch.cuda.synchronize()
    print(f"{tag} layer 256x14x14 3x3 {label:12} host {statistics.median(samples):6.1f} us/call",
          flush=True)
