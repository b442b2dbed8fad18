"""``torch.compile`` of a ``pycudnn.torch``-converted model against ``torch.compile`` of the plain
model, in one process; dynamo's graph breaks per converted model; the eager call's host cost.

Run on a GPU machine with PyTorch 2.4 or later and torchvision (``weights=None``: nothing is
downloaded):

    PYTHONPATH=. python3 benchmarks/compile_vs_torch.py --json $OUT/compile_vs_torch.json
    PYTHONPATH=. python3 benchmarks/compile_vs_torch.py --parts explain --models resnet50,densenet121

Parts (``--parts``, comma-separated):

* ``train``: training steps/s of torchvision's ``--model`` (resnet50) in bfloat16 channels_last
  at ``--batch`` (64): ``torch.compile(model)`` (default mode) of the plain model against
  ``torch.compile(pycudnn.torch.convert(model))``, the same initial weights, SGD with momentum
  (eager, outside the compiled region), cross entropy over 1000 classes, synthetic data,
  benchmark mode on for both (pycudnn routes each convolution signature to the faster side
  unless ``--routing pycudnn``). The first ``--warmup`` steps of each side (compilation and the
  searches) are timed as ``warmup_s`` and kept out; then timed blocks (CUDA events) alternate
  between the sides, and each side's figure is its median block.
* ``explain``: for each of ``--models``, ``torch._dynamo.explain`` of the plain model, of the
  converted one (training mode) and of ``fuse_for_inference``'s (eval mode, no grad), batch 2:
  graph breaks, graphs, the pycudnn operators in the graphs and the first break reasons.
* ``call``: host microseconds per eager call of ``pycudnn.torch.conv2d`` on a tiny convolution
  (1x8x8x8 input, eight 3x3 filters, float32), forward without autograd and forward + backward,
  chunks of back-to-back calls timed with ``time.perf_counter`` (device synchronized between
  chunks), median over chunks; and the tracing check alone. Run this part with two checkouts on
  ``PYTHONPATH`` (this script works with a pycudnn before the custom operators) to compare the
  eager call cost.

Ratios are pycudnn over PyTorch throughput: above 1 means pycudnn is faster. Results (and the
commit they were measured at) go to ``--json``; a part that fails records its error and the run
goes on.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import traceback

import torch

from zoo import MODELS, alternate, commit, data, make, step  # this script's folder is on sys.path


def part_train(args) -> dict:
    import pycudnn.torch as pt

    pt.set_routing(args.routing)
    pt.routing.clear_report()
    base = make(args.model, torch.bfloat16)
    models = {"torch": copy.deepcopy(base), "pycudnn": pt.convert(copy.deepcopy(base))}
    del base
    compiled = {k: torch.compile(m) for k, m in models.items()}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in models.items()}
    batches = data(args.batch, torch.bfloat16)
    warmup = {}
    for k in models:  # PyTorch's side first: pycudnn's routing then finds PyTorch's search done
        t0 = time.perf_counter()
        for i in range(args.warmup):
            step(compiled[k], opts[k], *batches[i % 2])
        torch.cuda.synchronize()
        warmup[k] = time.perf_counter() - t0
    it = {k: iter(range(10**9)) for k in models}
    fns = {k: (lambda k=k: step(compiled[k], opts[k], *batches[next(it[k]) % 2])) for k in models}
    per = alternate(fns, args.steps, args.rounds)
    row: dict = {k: {"steps_per_s": 1 / per[k], "warmup_s": warmup[k]} for k in models}
    row["pycudnn_over_torch"] = per["torch"] / per["pycudnn"]
    routed = pt.routing_report()
    row["routed_to_torch"] = sum(d["winner"] == "torch" for d in routed)
    row["kept_in_pycudnn"] = sum(d["winner"] == "pycudnn" for d in routed)
    row.update(model=args.model, batch=args.batch, routing=args.routing)
    print(f"{args.model} compiled train b{args.batch}: torch {row['torch']['steps_per_s']:.2f} "
          f"steps/s  pycudnn {row['pycudnn']['steps_per_s']:.2f}  ratio "
          f"{row['pycudnn_over_torch']:.3f}  (warm-up {args.warmup} steps {warmup['torch']:.0f} s"
          f" / {warmup['pycudnn']:.0f} s; signatures to torch {row['routed_to_torch']}, kept "
          f"{row['kept_in_pycudnn']})", flush=True)
    return row


def _explain(model, x) -> dict:
    torch._dynamo.reset()
    e = torch._dynamo.explain(model)(x)
    ops: dict[str, int] = {}
    for g in e.graphs:
        for n in g.graph.nodes:
            if n.op == "call_function" and str(n.target).startswith("pycudnn."):
                ops[str(n.target)] = ops.get(str(n.target), 0) + 1
    return {"graph_breaks": e.graph_break_count, "graphs": e.graph_count, "pycudnn_ops": ops,
            "break_reasons": [str(getattr(r, "reason", r))[:300] for r in e.break_reasons[:3]]}


def part_explain(args) -> dict:
    import pycudnn.torch as pt

    out: dict = {}
    for name in args.models.split(","):
        model = None
        try:
            model = make(name, torch.bfloat16)
            (x, _), = data(2, torch.bfloat16, count=1)
            row = {"plain": _explain(model, x)}
            pt.convert(model)
            row["converted"] = _explain(model, x)
            with torch.no_grad():
                row["fused"] = _explain(pt.fuse_for_inference(model.eval()), x)
        except Exception as exc:  # noqa: BLE001 - one failing model must not stop the run
            row = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
        out[name] = row
        print(f"{name:20} graph breaks: " + "  ".join(
            f"{k} {v['graph_breaks']} ({sum(v['pycudnn_ops'].values())} pycudnn ops)"
            for k, v in row.items() if isinstance(v, dict)), flush=True)
        del model
        torch.cuda.empty_cache()
    torch._dynamo.reset()
    return out


def _us_per_call(fn, chunks: int = 200, per_chunk: int = 50) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(chunks):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(per_chunk):
            fn()
        times.append((time.perf_counter() - t0) / per_chunk * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def part_call(args) -> dict:
    import pycudnn.torch as pt

    pt.set_routing("pycudnn")  # pycudnn's own call is what is timed
    x = torch.randn(1, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    gy = torch.randn(1, 8, 8, 8, device="cuda")

    def forward():
        pt.conv2d(x, w, None, 1, 1)

    def train():
        pt.conv2d(xg, wg, None, 1, 1).backward(gy)

    row: dict = {"forward_us": _us_per_call(forward), "forward_backward_us": _us_per_call(train)}
    try:
        from pycudnn.torch import library
    except ImportError:  # a pycudnn before the custom operators
        row["tracing_check_ns"] = None
    else:
        dyn, comp = library.dynamo_compiling, library.compiler

        def check():
            for _ in range(1000):
                if dyn() or comp._is_compiling_flag:
                    raise AssertionError("tracing in an eager loop")

        # microseconds per 1000 checks: nanoseconds per check (the loop's own step included)
        row["tracing_check_ns"] = _us_per_call(check, chunks=50, per_chunk=10)
    print(f"eager pycudnn.torch.conv2d: forward {row['forward_us']:.2f} us/call, forward + "
          f"backward {row['forward_backward_us']:.2f} us/call, tracing check "
          f"{row['tracing_check_ns']} ns", flush=True)
    return row


PARTS = {"train": part_train, "explain": part_explain, "call": part_call}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="explain,train,call")
    ap.add_argument("--model", default="resnet50", help="the model of the train part")
    ap.add_argument("--models", default=",".join(MODELS), help="the models of the explain part")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=5, help="first training steps, not timed")
    ap.add_argument("--steps", type=int, default=20, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=5, help="timed blocks per side")
    ap.add_argument("--routing", choices=("auto", "pycudnn"), default="auto")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("compile_vs_torch.py needs a CUDA build of PyTorch and an NVIDIA GPU")
    torch.backends.cudnn.benchmark = True
    import pycudnn

    results: dict = {"commit": commit(), "device": torch.cuda.get_device_name(),
                     "torch": torch.__version__, "cudnn": pycudnn.cudnn_version(),
                     "command": "benchmarks/compile_vs_torch.py " + " ".join(argv or sys.argv[1:])}
    for part in args.parts.split(","):
        try:
            results[part] = PARTS[part](args)
        except Exception as exc:  # noqa: BLE001 - one failing part must not stop the run
            results[part] = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
