"""Per ResNet-50 layer (batch 64, bf16 channels_last) and direction: host microseconds of
pycudnn.torch's call and of its launch alone, GPU time, against PyTorch's call; the plan each
chose (benchmark on and off) and the kernels each ran (torch.profiler).

    PYTHONPATH=. python3 benchmarks/probes/layer_host_cost.py

Results of 2026-12-01 (commit d0ab280): benchmarks/results/2026-12-01/probe_layer_host_cost.txt.
Written for that commit's flat pycudnn.torch (``pt._forward`` ...); here it calls the same
internals where they live now, in pycudnn.torch.calls.
"""
import statistics
import time

import torch
import torch.nn.functional as F

import pycudnn
import pycudnn.torch as pt
from pycudnn.torch import calls
from pycudnn.api.prepared import remembered_calls
from pycudnn.runtime.handle import get_handle

torch.backends.cudnn.benchmark = True
CL = torch.channels_last
bwd = torch.ops.aten.convolution_backward.default
LAYERS = [(64, 256, 14, 14, 256, 3, 1, 1), (64, 64, 56, 56, 64, 3, 1, 1),
          (64, 64, 56, 56, 256, 1, 1, 0), (64, 512, 7, 7, 2048, 1, 1, 0),
          (64, 1024, 14, 14, 256, 1, 1, 0), (64, 128, 28, 28, 128, 3, 1, 1)]


def host_us(fn, n=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    s = []
    for _ in range(5):
        torch.cuda._sleep(int(4e8))
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        s.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(s)


def gpu_us(fn, n=30):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s = []
    for _ in range(3):
        torch.cuda._sleep(int(4e8))
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        s.append(a.elapsed_time(b) / n * 1e3)
    return statistics.median(s)


def kernels(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:60] for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA})


for (n, c, h, w, k, r, st, pad) in LAYERS:
    x = torch.randn(n, c, h, w, device="cuda", dtype=torch.bfloat16).to(memory_format=CL)
    wt = torch.randn(k, c, r, r, device="cuda", dtype=torch.bfloat16).to(memory_format=CL)
    y = F.conv2d(x, wt, stride=st, padding=pad)
    gy = torch.randn_like(y)
    tfns = {"fwd": lambda: F.conv2d(x, wt, stride=st, padding=pad),
            "dgrad": lambda: bwd(gy, x, wt, None, [st, st], [pad, pad], [1, 1], False, [0, 0], 1,
                                 [True, False, False]),
            "wgrad": lambda: bwd(gy, x, wt, None, [st, st], [pad, pad], [1, 1], False, [0, 0], 1,
                                 [False, True, False])}
    for bench in (True, False):
        pycudnn.clear_caches()
        pt.clear_cache()
        pt.set_routing("pycudnn")  # pycudnn's own launches are what this probe times
        torch.backends.cudnn.benchmark = bench
        with pycudnn.flags(benchmark=bench):
            geom = ((st, st), (pad, pad), (1, 1), 1)
            pfns = {"fwd": lambda: calls.run_forward("conv", x, wt, None, None, 1.0, geom),
                    "dgrad": lambda: calls.run_backward_data(gy, wt, x, CL, geom),
                    "wgrad": lambda: calls.run_backward_filter(x, gy, wt, CL, geom)}
            for d in ("fwd", "dgrad", "wgrad"):
                torch.backends.cudnn.benchmark = bench
                pfns[d]()
                prep = remembered_calls()[-1]
                dev = x.get_device()
                s = torch.cuda.current_stream().cuda_stream
                hnd = get_handle(dev, s)
                o = torch.empty_like(y if d == "fwd" else (x if d == "dgrad" else wt))
                ptrs = {"fwd": (x.data_ptr(), wt.data_ptr(), o.data_ptr()),
                        "dgrad": (o.data_ptr(), wt.data_ptr(), gy.data_ptr()),
                        "wgrad": (x.data_ptr(), o.data_ptr(), gy.data_ptr())}[d]
                launch = prep.launcher
                row = {"ours_call": host_us(pfns[d]), "ours_launch": host_us(lambda: launch(hnd, ptrs, s)),
                       "ours_gpu": gpu_us(pfns[d])}
                torch.backends.cudnn.benchmark = True
                if bench:
                    row["torch_call"] = host_us(tfns[d])
                    row["torch_gpu"] = gpu_us(tfns[d])
                print(f"{n}x{c}x{h}x{w}->{k} {r}x{r}/{st} {d:5} bench={bench!s:5} "
                      + " ".join(f"{a}={b:6.1f}" for a, b in row.items())
                      + f" plan={prep.record.describe()[:70]}", flush=True)
                if bench:
                    print("   torch kernels:", kernels(tfns[d]))
                torch.backends.cudnn.benchmark = bench
                print("   ours  kernels:", kernels(pfns[d]))
