"""Batch normalization and dropout in pycudnn against PyTorch, same process, same memory.

Run on a GPU machine with PyTorch:

    PYTHONPATH=. python benchmarks/bn_dropout_vs_torch.py --json bn_dropout.json

Kernel time: ResNet-50's batch-norm shapes at batch 32 (the channels of each stage's BN:
32x64x112x112, 32x256x56x56, 32x512x28x28, 32x1024x14x14, 32x2048x7x7), in bfloat16 NHWC and
float32 NCHW, for

* training: ``F.batch_norm(training=True)`` forward + backward (autograd) against
  `batch_norm_forward_training` + `batch_norm_backward` (mode ``spatial_persistent`` for NHWC,
  PyTorch's own choice there, and ``spatial`` for NCHW);
* inference: ``F.batch_norm(training=False)`` against `batch_norm_forward_inference`;
* dropout (p = 0.5) forward + backward: ``F.dropout`` with autograd against
  `dropout_forward` + `dropout_backward`.

Timed with benchmarks/gpu_timing.py's gated batches (N back-to-back calls queued behind a gate,
then released: GPU time without host launch gaps) when that module is there, else with CUDA events
around N back-to-back calls after warm-up (large shapes, so launch gaps matter little).

Host time per call: a tiny shape (2x8x4x4 float32), torch tensors in, outputs allocated by each
library, microseconds per call with the GPU never the bottleneck.

``--json PATH`` writes every figure; ratios are torch / pycudnn (above 1: pycudnn is faster).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Any, Callable

SHAPES = [(32, 64, 112, 112), (32, 256, 56, 56), (32, 512, 28, 28), (32, 1024, 14, 14),
          (32, 2048, 7, 7)]
CONFIGS = {"bf16-nhwc": ("bfloat16", True), "fp32-nchw": ("float32", False)}


def _timers(torch: Any) -> tuple[Callable[..., dict[str, float]], Callable[..., dict[str, float]],
                                 str]:
    """(kernel timer, host timer, what the kernel timer is): gpu_timing.py where it exists."""
    try:
        import gpu_timing as gt  # this script's folder is on sys.path
    except ImportError:
        gt = None

    def events(fns: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
        out = {}
        for name, fn in fns.items():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            samples = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(reps):
                    fn()
                b.record()
                b.synchronize()
                samples.append(a.elapsed_time(b) * 1000 / reps)
            out[name] = statistics.median(samples)
        return out

    def host(fns: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
        if gt is not None:
            return {k: v["median"] for k, v in gt.compare_host(fns, reps).items()}
        import time

        out = {}
        for name, fn in fns.items():
            for _ in range(100):
                fn()
            torch.cuda.synchronize()
            best = math.inf
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(reps // 5):
                    fn()
                best = min(best, (time.perf_counter() - t0) / (reps // 5))
                torch.cuda.synchronize()
            out[name] = best * 1e6
        return out

    if gt is not None:
        def gated(fns: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
            stream = torch.cuda.current_stream().cuda_stream
            samples = gt.compare_gated(fns, stream, reps, 5,
                                       launches_per_call={k: 8 for k in fns})
            return {k: gt.median(v) for k, v in samples.items()}

        return gated, host, "gated batches (benchmarks/gpu_timing.py)"
    return events, host, "CUDA events around back-to-back calls"


def kernel_rows(torch: Any, F: Any, pycudnn: Any, bn: Any, dr: Any, kernel: Callable,
                reps: int) -> list[dict[str, Any]]:
    rows = []
    for cname, (dtype_name, channels_last) in CONFIGS.items():
        dt = getattr(torch, dtype_name)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        mode = "spatial_persistent" if channels_last else "spatial"
        for shape in SHAPES:
            c = shape[1]
            x = torch.randn(shape, device="cuda", dtype=dt).to(memory_format=fmt)
            dy = torch.randn_like(x)
            w = torch.rand(c, device="cuda") + 0.5
            b = torch.randn(c, device="cuda")
            rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
            xg = x.detach().requires_grad_()
            wg, bg = w.detach().requires_grad_(), b.detach().requires_grad_()
            X, DY = pycudnn.as_tensor(x), pycudnn.as_tensor(dy)
            state = dr.DropoutState(0.5, seed=0)

            def torch_train() -> None:
                y = F.batch_norm(xg, rm, rv, wg, bg, training=True, momentum=0.1, eps=1e-5)
                y.backward(dy)

            def ours_train() -> None:
                res = bn.batch_norm_forward_training(X, w, b, rm, rv, mode=mode)
                bn.batch_norm_backward(X, DY, w, res[1], res[2], mode=mode, reserve=res.reserve)

            def torch_infer() -> None:
                F.batch_norm(x, rm, rv, w, b, training=False)

            def ours_infer() -> None:
                bn.batch_norm_forward_inference(X, w, b, rm, rv)

            def torch_dropout() -> None:
                F.dropout(xg, 0.5, training=True).backward(dy)

            def ours_dropout() -> None:
                y, reserve = dr.dropout_forward(X, state)
                dr.dropout_backward(DY, state, reserve)

            for op, pair in (("bn train fwd+bwd", (torch_train, ours_train)),
                             ("bn inference", (torch_infer, ours_infer)),
                             ("dropout fwd+bwd", (torch_dropout, ours_dropout))):
                try:
                    settle(pair[1])
                    t = kernel({"torch": pair[0], "pycudnn": pair[1]}, reps)
                    err = ""
                except Exception as exc:  # noqa: BLE001 - a failed row is reported, not fatal
                    t, err = {"torch": float("nan"), "pycudnn": float("nan")}, \
                        f"{type(exc).__name__}: {exc}".splitlines()[0]
                rows.append({"config": cname, "shape": list(shape), "op": op,
                             "torch_us": t["torch"], "pycudnn_us": t["pycudnn"],
                             "ratio": t["torch"] / t["pycudnn"] if t["pycudnn"] else float("nan"),
                             "error": err})
                xg.grad = wg.grad = bg.grad = None
            torch.cuda.empty_cache()
    return rows


def settle(fn: Callable[[], Any]) -> None:
    """Call ``fn`` until pycudnn has chosen its kernel for the signature: the operations switch to
    runtime-compiled kernels built in the background after a few calls (pycudnn.ops.runtime_kernels),
    so the timing starts after the build is done, as in a training loop."""
    from pycudnn.ops import runtime_kernels

    for _ in range(4):
        fn()
    runtime_kernels.wait(timeout=120)


def host_rows(torch: Any, F: Any, pycudnn: Any, bn: Any, dr: Any, host: Callable,
              reps: int) -> dict[str, float]:
    x = torch.randn(2, 8, 4, 4, device="cuda")
    dy = torch.randn_like(x)
    w, b = torch.ones(8, device="cuda"), torch.zeros(8, device="cuda")
    rm, rv = torch.zeros(8, device="cuda"), torch.ones(8, device="cuda")
    sm, si = torch.zeros(8, device="cuda"), torch.ones(8, device="cuda")
    state = dr.DropoutState(0.5, seed=0)
    _, reserve = dr.dropout_forward(x, state)
    fns = {
        "F.batch_norm train": lambda: F.batch_norm(x, rm, rv, w, b, training=True),
        "pycudnn bn train": lambda: bn.batch_norm_forward_training(x, w, b, rm, rv),
        "torch bn backward (aten)": lambda: torch.ops.aten.native_batch_norm_backward(
            dy, x, w, rm, rv, sm, si, True, 1e-5, [True, True, True]),
        "pycudnn bn backward": lambda: bn.batch_norm_backward(x, dy, w, sm, si),
        "F.batch_norm inference": lambda: F.batch_norm(x, rm, rv, w, b, training=False),
        "pycudnn bn inference": lambda: bn.batch_norm_forward_inference(x, w, b, rm, rv),
        "F.dropout": lambda: F.dropout(x, 0.5, training=True),
        "pycudnn dropout fwd": lambda: dr.dropout_forward(x, state),
        "pycudnn dropout bwd": lambda: dr.dropout_backward(dy, state, reserve),
    }
    for name, fn in fns.items():
        if name.startswith("pycudnn"):
            settle(fn)
    return host(fns, reps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the results to this file")
    ap.add_argument("--reps", type=int, default=50, help="calls per timed batch")
    ap.add_argument("--host-reps", type=int, default=2000, help="calls for the host figures")
    ap.add_argument("--skip-kernel", action="store_true", help="host figures only")
    ap.add_argument("--legacy-kernels", action="store_true",
                    help="keep pycudnn on cuDNN's legacy kernels (no runtime-compiled ones)")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    import pycudnn
    from pycudnn.ops import batchnorm as bn
    from pycudnn.ops import dropout as dr

    torch.backends.cudnn.enabled = True
    if args.legacy_kernels:
        from pycudnn.ops import runtime_kernels

        runtime_kernels.configure(enabled=False)
    kernel, host, how = _timers(torch)
    result: dict[str, Any] = {"torch": torch.__version__, "cudnn": pycudnn.cudnn_version(),
                              "device": torch.cuda.get_device_name(), "kernel_timer": how}
    if not args.skip_kernel:
        rows = kernel_rows(torch, F, pycudnn, bn, dr, kernel, args.reps)
        result["kernel"] = rows
        print(f"kernel time per call, us ({how}); ratio = torch / pycudnn")
        print(f"{'config':<10} {'shape':<20} {'op':<18} {'torch':>9} {'pycudnn':>9} {'ratio':>6}")
        for r in rows:
            shape = "x".join(map(str, r["shape"]))
            print(f"{r['config']:<10} {shape:<20} {r['op']:<18} {r['torch_us']:>9.1f} "
                  f"{r['pycudnn_us']:>9.1f} {r['ratio']:>6.2f} {r['error']}")
    hosts = host_rows(torch, F, pycudnn, bn, dr, host, args.host_reps)
    result["host_us"] = hosts
    print("\nhost time per call, us (2x8x4x4 float32, torch tensors in, outputs allocated)")
    for name, us in hosts.items():
        print(f"  {name:<28} {us:8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
