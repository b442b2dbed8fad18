"""Fused conv + bias + residual + relu in pycudnn against PyTorch eager and torch.compile.

Run on a GPU machine with PyTorch:   PYTHONPATH=. python benchmarks/fused_vs_torch.py --json fused.json

The six ResNet-50 block layers of MEASURED.md section 2b, batch 32, bf16 and fp16 NHWC:
``relu(conv2d(x, w) + b + alpha * z)`` through ``pycudnn.convolution_add_relu`` (one fused graph
where an engine takes it) against PyTorch eager (cudnn.benchmark on) and ``torch.compile`` of the
same function (default mode); also conv + bias and conv + bias + relu. Same process, same torch
tensors in for every side, outputs allocated by each call (no ``out=``), torch's current stream.

What is measured: GPU time per call with the host far ahead (``gpu_timing.compare_gated``: batches
queued behind a gate the host opens after the last call, so no host launch gap is timed; the
sides' batches interleaved, the order rotated each round). Host cost is not in these figures: at
batch 32 torch.compile's per-call host cost exceeds these layers' GPU time, which back-to-back
timing would have charged to it. Ratios are torch / pycudnn (above 1: pycudnn is faster).
"""

from __future__ import annotations

import argparse
import json
import sys

import gpu_timing  # this script's folder is on sys.path

LAYERS = [  # (N, C, H, K, R, stride, pad)
    (32, 64, 56, 256, 1, 1, 0),
    (32, 256, 56, 64, 1, 1, 0),
    (32, 64, 56, 64, 3, 1, 1),
    (32, 256, 14, 256, 3, 1, 1),
    (32, 256, 14, 1024, 1, 1, 0),
    (32, 512, 7, 2048, 1, 1, 0),
]


#: launches per call the gate must leave room for (eager: conv, three pointwise ops, relu)
LAUNCHES = {"eager": 6, "compile": 4, "bias_eager": 2, "bias_relu_eager": 3}


def kernel_times_ms(torch, fns, reps=50, batches=4):
    """Median gated GPU time per call (ms) of each function, batches interleaved."""
    samples = gpu_timing.compare_gated(fns, torch.cuda.current_stream().cuda_stream, reps, batches,
                                       launches_per_call={k: LAUNCHES.get(k, 2) for k in fns},
                                       synchronize=torch.cuda.synchronize)
    return {k: gpu_timing.median(v) / 1e3 for k, v in samples.items()}


geomean = gpu_timing.geomean


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=None,
                    help="batch size instead of 32 (a larger one makes the GPU time dominate)")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    import pycudnn

    torch.backends.cudnn.benchmark = True
    alpha = args.alpha

    def eager_add_relu(x, w, b, z):
        return torch.relu(F.conv2d(x, w) + b.view(1, -1, 1, 1) + alpha * z)

    def eager_add_relu_p(x, w, b, z, s, p):
        return torch.relu(F.conv2d(x, w, stride=s, padding=p) + b.view(1, -1, 1, 1) + alpha * z)

    # every layer is a new shape for dynamo: allow one compilation per layer and dtype
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    compiled = None
    compile_note = ""
    if not args.no_compile:
        try:
            # dynamic=False: one specialised graph per layer, as a model compiled for fixed shapes
            # gets (automatic dynamic shapes would turn later layers into generic kernels)
            compiled = torch.compile(eager_add_relu_p, dynamic=False)
        except Exception as exc:  # noqa: BLE001
            compile_note = f"torch.compile unavailable: {exc}"
    rows = []
    for dtype_name in ("bfloat16", "float16"):
        dt = getattr(torch, dtype_name)
        for (n, c, h, k, r, s, p) in LAYERS:
            n = args.batch or n
            cl = torch.channels_last
            x = torch.randn(n, c, h, h, device="cuda", dtype=dt).to(memory_format=cl)
            w = (torch.randn(k, c, r, r, device="cuda", dtype=dt) * 0.05).to(memory_format=cl)
            b = torch.randn(k, device="cuda", dtype=dt)
            oh = (h + 2 * p - r) // s + 1
            z = torch.randn(n, k, oh, oh, device="cuda", dtype=dt).to(memory_format=cl)
            stream = torch.cuda.current_stream()
            row = {"dtype": dtype_name, "layer": [n, c, h, h, k, r, s, p]}
            kw = dict(stride=s, padding=p, benchmark=True, stream=stream)
            fns = {
                "fused": lambda: pycudnn.convolution_add_relu(x, w, z, alpha=alpha, bias=b, **kw),
                "eager": lambda: eager_add_relu_p(x, w, b, z, s, p),
                "bias": lambda: pycudnn.convolution(x, w, b, **kw),
                "bias_eager": lambda: F.conv2d(x, w, b, stride=s, padding=p),
                "bias_relu": lambda: pycudnn.convolution(x, w, b, activation="relu", **kw),
                "bias_relu_eager": lambda: torch.relu(F.conv2d(x, w, b, stride=s, padding=p)),
            }
            if compiled is not None:
                fns["compile"] = lambda: compiled(x, w, b, z, s, p)
            try:
                Y = fns["fused"]()  # searches (benchmark on), outside the timing
                choice = [e for e in pycudnn.benchmark_cache() if e["epilogue"] == "add_relu"
                          and list(e["params"].input_shape) == [n, c, h, h]]
                row["fused_choice"] = choice[-1]["choice"] if choice else "?"
                ref = eager_add_relu_p(x.double(), w.double(), b.double(), z.double(), s, p)
                got = torch.from_dlpack(Y).double()
                row["max_rel_err"] = float((got - ref).abs().max() / ref.abs().max())
                del Y, got, ref
                for name in list(fns):  # first calls (searches, compilation) outside the timing
                    try:
                        fns[name]()
                    except Exception as exc:  # noqa: BLE001
                        if name == "compile":
                            compile_note = f"torch.compile failed: {gpu_timing.error_text(exc)}"
                            compiled = None
                            del fns[name]
                        else:
                            raise
                torch.cuda.synchronize()
                times = kernel_times_ms(torch, fns)
            except Exception as exc:  # noqa: BLE001 - a failing row is reported, the run goes on
                row["error"] = gpu_timing.error_text(exc)
                print(f"{dtype_name:8} {str(row['layer']):32} error: {row['error']}", flush=True)
                rows.append(row)
                torch.cuda.synchronize()
                continue
            for name, ms in times.items():
                row[f"{name}_ms"] = ms
            row["eager_over_fused"] = row["eager_ms"] / row["fused_ms"]
            if "compile_ms" in row:
                row["compile_over_fused"] = row["compile_ms"] / row["fused_ms"]
            row["bias_eager_over_pycudnn"] = row["bias_eager_ms"] / row["bias_ms"]
            row["bias_relu_eager_over_pycudnn"] = row["bias_relu_eager_ms"] / row["bias_relu_ms"]
            rows.append(row)
            print(f"{dtype_name:8} {str(row['layer']):32} fused {row['fused_ms']:.4f} ms  eager {row['eager_ms']:.4f} "
                  f"({row['eager_over_fused']:.2f}x)  compile {row.get('compile_ms', float('nan')):.4f} "
                  f"({row.get('compile_over_fused', float('nan')):.2f}x)  bias {row['bias_eager_over_pycudnn']:.2f}x  "
                  f"bias+relu {row['bias_relu_eager_over_pycudnn']:.2f}x  err {row['max_rel_err']:.1e}", flush=True)
    summary = {
        "eager_over_fused_geomean": geomean([r.get("eager_over_fused") for r in rows]),
        "compile_over_fused_geomean": geomean([r.get("compile_over_fused") for r in rows]),
        "bias_relu_eager_over_pycudnn_geomean": geomean([r.get("bias_relu_eager_over_pycudnn") for r in rows]),
        "bias_eager_over_pycudnn_geomean": geomean([r.get("bias_eager_over_pycudnn") for r in rows]),
        "errors": [f"{r['dtype']} {r['layer']}: {r['error']}" for r in rows if "error" in r],
        "what": "GPU time per call, host far ahead (gated); torch tensors in, outputs allocated",
        "compile_note": compile_note,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary, "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "cudnn": pycudnn.cudnn_version(), "alpha": alpha}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
