"""Fused conv + bias + residual + relu in pycudnn against PyTorch eager and torch.compile.

Run on a GPU machine with PyTorch:   PYTHONPATH=. python benchmarks/fused_vs_torch.py --json fused.json

The six ResNet-50 block layers of MEASURED.md section 2b, batch 32, bf16 and fp16 NHWC:
``relu(conv2d(x, w) + b + alpha * z)`` through ``pycudnn.convolution_add_relu`` (one fused graph
where an engine takes it) against PyTorch eager (cudnn.benchmark on) and ``torch.compile`` of the
same function (default mode); also conv + bias and conv + bias + relu. Same process, same tensors,
CUDA events over back-to-back calls. Ratios are torch / pycudnn (above 1: pycudnn is faster).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from conv_vs_torch import time_calls as _time_calls  # this script's folder is on sys.path

LAYERS = [  # (N, C, H, K, R, stride, pad)
    (32, 64, 56, 256, 1, 1, 0),
    (32, 256, 56, 64, 1, 1, 0),
    (32, 64, 56, 64, 3, 1, 1),
    (32, 256, 14, 256, 3, 1, 1),
    (32, 256, 14, 1024, 1, 1, 0),
    (32, 512, 7, 2048, 1, 1, 0),
]


def time_calls(torch, fn):
    """The shared timing (benchmarks/conv_vs_torch.py): 50 back-to-back calls after 3 warm-up calls."""
    return _time_calls(torch, fn, reps=50, warmup=3)


def geomean(v):
    v = [x for x in v if x and x > 0]
    return math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")


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
            X, W, B, Z = (pycudnn.as_tensor(t) for t in (x, w, b, z))
            row = {"dtype": dtype_name, "layer": [n, c, h, h, k, r, s, p]}
            Y = pycudnn.convolution_add_relu(X, W, Z, alpha=alpha, bias=B, stride=s, padding=p, benchmark=True)
            row["fused_ms"] = time_calls(torch, lambda: pycudnn.convolution_add_relu(
                X, W, Z, alpha=alpha, bias=B, stride=s, padding=p, out=Y, benchmark=True))
            choice = [e for e in pycudnn.benchmark_cache() if e["epilogue"] == "add_relu"
                      and list(e["params"].input_shape) == [n, c, h, h]]
            row["fused_choice"] = choice[-1]["choice"] if choice else "?"
            row["eager_ms"] = time_calls(torch, lambda: eager_add_relu_p(x, w, b, z, s, p))
            ref = eager_add_relu_p(x.double(), w.double(), b.double(), z.double(), s, p)
            got = torch.from_dlpack(Y).double()
            row["max_rel_err"] = float((got - ref).abs().max() / ref.abs().max())
            if compiled is not None:
                try:
                    row["compile_ms"] = time_calls(torch, lambda: compiled(x, w, b, z, s, p))
                except Exception as exc:  # noqa: BLE001
                    compile_note = f"torch.compile failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
                    compiled = None
            # conv + bias and conv + bias + relu
            Yb = pycudnn.convolution(X, W, B, stride=s, padding=p, benchmark=True)
            row["bias_ms"] = time_calls(torch, lambda: pycudnn.convolution(X, W, B, stride=s, padding=p, out=Yb, benchmark=True))
            row["bias_eager_ms"] = time_calls(torch, lambda: F.conv2d(x, w, b, stride=s, padding=p))
            Yr = pycudnn.convolution(X, W, B, stride=s, padding=p, activation="relu", benchmark=True)
            row["bias_relu_ms"] = time_calls(torch, lambda: pycudnn.convolution(
                X, W, B, stride=s, padding=p, activation="relu", out=Yr, benchmark=True))
            row["bias_relu_eager_ms"] = time_calls(torch, lambda: torch.relu(F.conv2d(x, w, b, stride=s, padding=p)))
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
            del x, w, b, z, X, W, B, Z, Y, Yb, Yr
    summary = {
        "eager_over_fused_geomean": geomean([r["eager_over_fused"] for r in rows]),
        "compile_over_fused_geomean": geomean([r.get("compile_over_fused") for r in rows]),
        "bias_relu_eager_over_pycudnn_geomean": geomean([r["bias_relu_eager_over_pycudnn"] for r in rows]),
        "bias_eager_over_pycudnn_geomean": geomean([r["bias_eager_over_pycudnn"] for r in rows]),
        "compile_note": compile_note,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary, "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "cudnn": pycudnn.version(), "alpha": alpha}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
