"""pycudnn (graph and v7 engines) against PyTorch's cuDNN path, in one process, on the same tensors.

Run on a GPU machine with PyTorch installed:

    PYTHONPATH=. python benchmarks/conv_vs_torch.py --json results.json

1. Kernel time: ResNet-50's 23 distinct convolution layers at batch 32 in bf16 NHWC, fp16 NHWC,
   fp32 NCHW with TF32 and fp32 NCHW strict; forward, backward data and backward filter. Both
   sides search by measurement first (pycudnn ``benchmark=True``, PyTorch
   ``torch.backends.cudnn.benchmark = True``), then each call is timed with CUDA events over
   back-to-back launches (host launch cost included, as a training step sees it).
2. Host overhead: the tiny convolution (1x8x8x8 input, eight 3x3 filters, fp32) per call through
   ``pycudnn.convolution``, through a prepared convolution, and through ``F.conv2d``.
3. First-call cost of a new shape with benchmark on: pycudnn (graph) and PyTorch.

Ratios are torch / pycudnn: above 1 means pycudnn is faster.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np

import host_per_call  # this script's folder is on sys.path

# (name, C, H, K, R, stride, pad) at batch N: input N x C x H x H, K filters of R x R
RESNET50_LAYERS = [
    ("conv1", 3, 224, 64, 7, 2, 3),
    ("l1.1x1a", 64, 56, 64, 1, 1, 0),
    ("l1.3x3", 64, 56, 64, 3, 1, 1),
    ("l1.1x1b", 64, 56, 256, 1, 1, 0),
    ("l1.1x1c", 256, 56, 64, 1, 1, 0),
    ("l2.1x1a", 256, 56, 128, 1, 1, 0),
    ("l2.3x3s2", 128, 56, 128, 3, 2, 1),
    ("l2.1x1b", 128, 28, 512, 1, 1, 0),
    ("l2.down", 256, 56, 512, 1, 2, 0),
    ("l2.1x1c", 512, 28, 128, 1, 1, 0),
    ("l2.3x3", 128, 28, 128, 3, 1, 1),
    ("l3.1x1a", 512, 28, 256, 1, 1, 0),
    ("l3.3x3s2", 256, 28, 256, 3, 2, 1),
    ("l3.1x1b", 256, 14, 1024, 1, 1, 0),
    ("l3.down", 512, 28, 1024, 1, 2, 0),
    ("l3.1x1c", 1024, 14, 256, 1, 1, 0),
    ("l3.3x3", 256, 14, 256, 3, 1, 1),
    ("l4.1x1a", 1024, 14, 512, 1, 1, 0),
    ("l4.3x3s2", 512, 14, 512, 3, 2, 1),
    ("l4.1x1b", 512, 7, 2048, 1, 1, 0),
    ("l4.down", 1024, 14, 2048, 1, 2, 0),
    ("l4.1x1c", 2048, 7, 512, 1, 1, 0),
    ("l4.3x3", 512, 7, 512, 3, 1, 1),
]

CONFIGS = {
    # name: (torch dtype name, channels_last, allow_tf32)
    "bf16-nhwc": ("bfloat16", True, True),
    "fp16-nhwc": ("float16", True, True),
    "fp32-nchw-tf32": ("float32", False, True),
    "fp32-nchw": ("float32", False, False),
}
DIRECTIONS = ("fwd", "dgrad", "wgrad")


def time_calls(torch, fn, reps: int, trials: int = 5, warmup: int = 1) -> float:
    """Median over trials of the mean per-call time (ms) of ``reps`` back-to-back calls, after
    ``warmup`` calls (CUDA events on the current stream: host launch cost included)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / reps)
    return statistics.median(samples)


def flops(n, c, h, k, r, stride, pad) -> float:
    o = (h + 2 * pad - r) // stride + 1
    return 2.0 * n * k * c * r * r * o * o


def kernel_benchmark(torch, F, pycudnn, layers, configs, directions, engines, batch, reps):
    rows = []
    total = len(layers) * len(configs) * len(directions)
    done = 0
    for cname in configs:
        dtype_name, channels_last, tf32 = CONFIGS[cname]
        tdtype = getattr(torch, dtype_name)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        for (lname, c, h, k, r, s, p) in layers:
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            x = torch.randn(batch, c, h, h, device="cuda", dtype=tdtype).to(memory_format=fmt)
            w = (torch.randn(k, c, r, r, device="cuda", dtype=tdtype) * 0.05).to(memory_format=fmt)
            y = F.conv2d(x, w, stride=s, padding=p)
            dy = torch.randn_like(y)
            X, W, DY = pycudnn.as_tensor(x), pycudnn.as_tensor(w), pycudnn.as_tensor(dy)
            gf = flops(batch, c, h, k, r, s, p)
            for d in directions:
                done += 1
                print(f"\r[{done}/{total}] {cname} {lname} {d}        ", end="", file=sys.stderr, flush=True)
                if d == "fwd":
                    tfn = lambda: F.conv2d(x, w, stride=s, padding=p)  # noqa: E731
                elif d == "dgrad":
                    tfn = lambda: torch.ops.aten.convolution_backward(  # noqa: E731
                        dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, [True, False, False])
                else:
                    tfn = lambda: torch.ops.aten.convolution_backward(  # noqa: E731
                        dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, [False, True, False])
                row = {"config": cname, "layer": lname, "direction": d,
                       "shape": [batch, c, h, h, k, r, s, p], "gflop": gf / 1e9}
                row["torch_ms"] = time_calls(torch, tfn, reps)
                for e in engines:
                    kw = dict(stride=s, padding=p, engine=e, benchmark=True, allow_tf32=tf32)
                    try:
                        if d == "fwd":
                            out = pycudnn.convolution(X, W, **kw)
                            pfn = lambda: pycudnn.convolution(X, W, out=out, **kw)  # noqa: E731
                        elif d == "dgrad":
                            out = pycudnn.convolution_backward_data(DY, W, tuple(x.shape), **kw)
                            pfn = lambda: pycudnn.convolution_backward_data(  # noqa: E731
                                DY, W, tuple(x.shape), out=out, **kw)
                        else:
                            out = pycudnn.convolution_backward_filter(X, DY, tuple(w.shape), **kw)
                            pfn = lambda: pycudnn.convolution_backward_filter(  # noqa: E731
                                X, DY, tuple(w.shape), out=out, **kw)
                        ms = time_calls(torch, pfn, reps)
                        row[f"{e}_ms"] = ms
                        row[f"{e}_ratio"] = row["torch_ms"] / ms
                        row[f"{e}_tflops"] = gf / ms / 1e9
                    except Exception as exc:  # noqa: BLE001 - a failing cell is reported, not fatal
                        row[f"{e}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                row["torch_tflops"] = gf / row["torch_ms"] / 1e9
                rows.append(row)
            del x, w, y, dy, X, W, DY
    print(file=sys.stderr)
    return rows


def host_overhead(torch, F, pycudnn, calls: int):
    x = torch.randn(1, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    X, W = pycudnn.as_tensor(x), pycudnn.as_tensor(w)
    torch.backends.cudnn.allow_tf32 = True
    out = {}

    def per_call(fn):
        return host_per_call.per_call(torch, fn, calls)

    out["torch_F.conv2d_us"] = per_call(lambda: F.conv2d(x, w, padding=1))
    out["pycudnn.convolution_us"] = per_call(lambda: pycudnn.convolution(X, W, padding=1))
    conv = pycudnn.prepare_convolution(X, W, padding=1)
    Y = conv(X, W)
    out["prepared_us"] = per_call(lambda: conv(X, W, out=Y))
    out["prepared_new_output_us"] = per_call(lambda: conv(X, W))
    out["convolution_ratio_to_torch"] = out["pycudnn.convolution_us"] / out["torch_F.conv2d_us"]
    out["prepared_ratio_to_torch"] = out["prepared_us"] / out["torch_F.conv2d_us"]
    out["choice"] = repr(conv)
    return out


def first_call(torch, F, pycudnn, batch: int):
    """A shape neither side has seen, benchmark on: time to the first result."""
    # warm both libraries up on an unrelated shape: one-time loading is not a per-shape cost
    xw = torch.randn(2, 8, 8, 8, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    ww = torch.randn(8, 8, 3, 3, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    F.conv2d(xw, ww, padding=1)
    pycudnn.convolution(pycudnn.as_tensor(xw), pycudnn.as_tensor(ww), padding=1, benchmark=True)
    torch.cuda.synchronize()
    res = []
    for (c, h, k, r, s, p) in [(96, 40, 160, 3, 1, 1), (48, 36, 80, 1, 1, 0)]:
        x = torch.randn(batch, c, h, h, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        w = torch.randn(k, c, r, r, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        F.conv2d(x, w, stride=s, padding=p)
        torch.cuda.synchronize()
        t_torch = time.perf_counter() - t0
        X, W = pycudnn.as_tensor(x), pycudnn.as_tensor(w)
        t0 = time.perf_counter()
        pycudnn.convolution(X, W, stride=s, padding=p, benchmark=True)
        torch.cuda.synchronize()
        t_pc = time.perf_counter() - t0
        res.append({"shape": [batch, c, h, h, k, r, s, p], "torch_ms": t_torch * 1e3, "pycudnn_graph_ms": t_pc * 1e3})
    return res


def geomean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--directions", default=",".join(DIRECTIONS))
    ap.add_argument("--engines", default="graph,v7")
    ap.add_argument("--layers", default="all", help="comma-separated layer names, or 'all'")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--host-calls", type=int, default=5000)
    ap.add_argument("--skip-kernels", action="store_true")
    ap.add_argument("--skip-host", action="store_true", help="skip the host-overhead and first-call parts")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    import pycudnn

    torch.backends.cudnn.benchmark = True
    configs = args.configs.split(",")
    directions = args.directions.split(",")
    engines = args.engines.split(",")
    layers = RESNET50_LAYERS if args.layers == "all" else [l for l in RESNET50_LAYERS if l[0] in args.layers.split(",")]
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "torch_cudnn": torch.backends.cudnn.version(), "pycudnn_cudnn": pycudnn.version(),
              "batch": args.batch, "reps": args.reps}
    report["first_call"] = [] if args.skip_host else first_call(torch, F, pycudnn, args.batch)
    if not args.skip_kernels:
        rows = kernel_benchmark(torch, F, pycudnn, layers, configs, directions, engines, args.batch, args.reps)
        report["cells"] = rows
        print(f"{'config':15} {'layer':10} {'dir':6} {'torch ms':>9} {'TFLOP/s':>8} " +
              " ".join(f"{e + ' ms':>9} {e + ' t/p':>8}" for e in engines))
        for r in rows:
            line = f"{r['config']:15} {r['layer']:10} {r['direction']:6} {r['torch_ms']:9.4f} {r['torch_tflops']:8.1f} "
            for e in engines:
                if f"{e}_ms" in r:
                    line += f"{r[e + '_ms']:9.4f} {r[e + '_ratio']:8.3f} "
                else:
                    line += f"{'error':>9} {'':8} "
            print(line)
        summary = {}
        for e in engines:
            ratios = [r[f"{e}_ratio"] for r in rows if f"{e}_ratio" in r]
            per_cfg = {c: geomean([r[f"{e}_ratio"] for r in rows if r["config"] == c and f"{e}_ratio" in r]) for c in configs}
            summary[e] = {"geomean": geomean(ratios), "min": min(ratios) if ratios else None,
                          "cells_below_0.90": sum(1 for v in ratios if v < 0.90),
                          "errors": sum(1 for r in rows if f"{e}_error" in r), "per_config": per_cfg}
            print(f"{e}: geomean torch/pycudnn = {summary[e]['geomean']:.3f}, min = {summary[e]['min']:.3f}, "
                  f"cells < 0.90: {summary[e]['cells_below_0.90']}, errors: {summary[e]['errors']}, "
                  + ", ".join(f"{c}={v:.3f}" for c, v in per_cfg.items()))
        report["summary"] = summary
    if args.skip_host:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1, default=str)
        return 0
    report["host_overhead"] = host_overhead(torch, F, pycudnn, args.host_calls)
    h = report["host_overhead"]
    print(f"host per call: F.conv2d {h['torch_F.conv2d_us']:.2f} us, pycudnn.convolution "
          f"{h['pycudnn.convolution_us']:.2f} us ({h['convolution_ratio_to_torch']:.2f}x), prepared "
          f"{h['prepared_us']:.2f} us ({h['prepared_ratio_to_torch']:.2f}x), prepared with a new output "
          f"{h['prepared_new_output_us']:.2f} us")
    for fc in report["first_call"]:
        print(f"first call, new shape {fc['shape']} benchmark on: torch {fc['torch_ms']:.1f} ms, "
              f"pycudnn graph {fc['pycudnn_graph_ms']:.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
