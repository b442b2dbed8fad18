"""Why a fused model under torch.compile trains slower than the plain model compiled: per side,
the host time to issue a step (the GPU never waited on), the step end to end, and the GPU's own
time per step (the stream held by a sleep kernel while the host queues); then one profiled step
per side: its kernels by GPU time and the host operators by self time.

    PYTHONPATH=. python3 benchmarks/probes/compile_step_profile.py [--model resnet50]
        [--batch 64] [--sides torch,fused,compile,fused_compile]

Run from the project root (it imports benchmarks/zoo.py).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))  # run from the project root
import torch  # noqa: E402

import zoo  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--model", default="resnet50")
p.add_argument("--batch", type=int, default=64)
p.add_argument("--sides", default="torch,fused,compile,fused_compile")
p.add_argument("--top", type=int, default=14)
args = p.parse_args()
torch.backends.cudnn.benchmark = True

base = zoo.make(args.model, torch.bfloat16)
names = args.sides.split(",")
sides = {k: zoo.training_side(k, base) for k in names}
opts = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in sides.items()}
steps = {k: zoo.side_step(k) for k in names}
batches = zoo.data(args.batch, torch.bfloat16)


def run(k: str, n: int) -> None:
    for i in range(n):
        steps[k](sides[k], opts[k], *batches[i % 2])


for k in names:
    t0 = time.perf_counter()
    run(k, 8)
    torch.cuda.synchronize()
    print(f"{k:14} warm-up 8 steps {time.perf_counter() - t0:6.1f} s", flush=True)

for rep in range(2):
    for k in names:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run(k, 20)
        host = (time.perf_counter() - t0) / 20
        torch.cuda.synchronize()
        total = (time.perf_counter() - t0) / 20
        torch.cuda._sleep(int(3e9))  # ~1.5 s: the host queues all 10 steps before the GPU starts
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        run(k, 10)
        e1.record()
        e1.synchronize()
        print(f"{k:14} host-issue {host * 1e3:6.2f} ms/step  end-to-end {total * 1e3:6.2f} ms/step"
              f"  GPU-held {e0.elapsed_time(e1) / 10:6.2f} ms/step", flush=True)

from torch.profiler import ProfilerActivity, profile  # noqa: E402

for k in names:
    run(k, 2)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run(k, 1)
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_total = sum(e.self_device_time_total for e in kernels)
    launches = sum(e.count for e in kernels)
    print(f"\n== {k}: {launches} GPU events, {gpu_total / 1e3:.2f} ms GPU time in one step")
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:args.top]:
        print(f"  {e.self_device_time_total / 1e3:7.3f} ms  x{e.count:<4} {e.key[:110]}")
    cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    print(f"  -- host operators by self time (of {sum(e.self_cpu_time_total for e in cpu) / 1e3:.2f} ms)")
    for e in sorted(cpu, key=lambda e: -e.self_cpu_time_total)[:args.top]:
        print(f"  {e.self_cpu_time_total / 1e3:7.3f} ms  x{e.count:<4} {e.key[:110]}")
