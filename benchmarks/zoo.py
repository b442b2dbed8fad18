"""torchvision CNNs through ``pycudnn.torch`` against PyTorch eager, in one process.

Run on a GPU machine with PyTorch and torchvision (``weights=None``: nothing is downloaded):

    PYTHONPATH=. python3 benchmarks/zoo.py --json $OUT/zoo.json
    PYTHONPATH=. python3 benchmarks/zoo.py --models resnet50,convnext_tiny --parts train,infer

Per model, bfloat16 channels_last, both sides with benchmark mode on (``torch.backends.cudnn.
benchmark = True``; pycudnn routes each convolution signature to the faster side, see
``pycudnn/torch/routing.py``), the same initial weights:

* ``train``: eager training steps/s (SGD, cross entropy over 1000 classes, synthetic data) at each
  ``--batch``; "pycudnn" is the model after ``pycudnn.torch.convert``. The first steps of each side
  (their searches; PyTorch's side first, so pycudnn's finds PyTorch's own search done) are
  timed as ``warmup_s`` and then kept out: timed blocks alternate
  between the sides after warm-up, and each side's figure is the median block.
  "fused" is the converted model after ``pycudnn.torch.fuse_for_training`` (Conv-BN[-add]-ReLU
  as one node with cuDNN's fused batch-norm kernels); "compile" (``--train-sides``) is
  ``torch.compile`` of the plain model, default mode.
* ``infer``: inference img/s at ``--infer-batch``, eval mode: PyTorch eager against
  ``pycudnn.torch.fuse_for_inference`` (BatchNorm folded, Conv-BN-ReLU fused).
* ``graph``: the training step captured whole in a CUDA graph (PyTorch's whole-network capture:
  forward, backward and the optimizer step; static input), steps/s of graph replays: the GPU's
  time alone, no host launch cost, for each of ``--train-sides`` but "compile".
* ``first``: the first training step of a fresh process with an empty tuning database
  (``PYCUDNN_CACHE_DIR`` a new temporary folder), each side in its own subprocess, timed from
  the step's start (CUDA context, model and data already made) to its end.
* ``check``: float32 with TF32 off, batch 4: the logits, the loss and the first convolution's
  weight gradient of the converted model against PyTorch's, each as a relative error next to
  PyTorch's own distance from a float64 run (the bound a pycudnn error should stay within).

Ratios are pycudnn over PyTorch throughput: above 1 means pycudnn is faster. Results (and the
commit they were measured at) go to ``--json``; a part that fails records its error and the run
goes on.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

MODELS = ("resnet50", "resnext50_32x4d", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny",
          "regnet_y_800mf", "densenet121")
CL = torch.channels_last


def commit() -> str:
    if os.environ.get("PYCUDNN_COMMIT"):  # a copy whose git metadata is not this tree's
        return os.environ["PYCUDNN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001 - a copy without git
        return "unknown"


def make(name: str, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    import torchvision

    torch.manual_seed(seed)
    return getattr(torchvision.models, name)(weights=None).cuda().to(dtype, memory_format=CL)


def data(batch: int, dtype: torch.dtype, seed: int = 1, count: int = 2):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.randn(batch, 3, 224, 224, device="cuda", generator=g).to(dtype, memory_format=CL),
             torch.randint(0, 1000, (batch,), device="cuda", generator=g)) for _ in range(count)]


def step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()


def timed_block(fn, n: int) -> float:
    """Seconds per call of ``fn`` over ``n`` calls (CUDA events)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / n


def alternate(fns: dict, n: int, rounds: int) -> dict:
    """Median seconds per call of each of ``fns``, timed in alternating blocks."""
    times: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(timed_block(fn, n))
    return {k: statistics.median(v) for k, v in times.items()}


def part_train(name: str, args) -> dict:
    import pycudnn.torch as pt

    out: dict = {}
    for batch in args.batch:
        pt.routing.clear_report()
        base = make(name, torch.bfloat16)
        makers = {"torch": lambda: copy.deepcopy(base),
                  "pycudnn": lambda: pt.convert(copy.deepcopy(base)),
                  "fused": lambda: pt.fuse_for_training(pt.convert(copy.deepcopy(base))),
                  "compile": lambda: torch.compile(copy.deepcopy(base))}
        sides = {k: makers[k]() for k in args.train_sides}
        del base
        opts = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in sides.items()}
        batches = data(batch, torch.bfloat16)
        first = {}
        for k, m in sides.items():
            t0 = time.perf_counter()
            for i in range(args.warmup):
                step(m, opts[k], *batches[i % 2])
            torch.cuda.synchronize()
            first[k] = time.perf_counter() - t0
        it = {k: iter(range(10**9)) for k in sides}
        fns = {k: (lambda k=k: step(sides[k], opts[k], *batches[next(it[k]) % 2])) for k in sides}
        per = alternate(fns, args.steps, args.rounds)
        row = {k: {"steps_per_s": 1 / per[k], "warmup_s": first[k]} for k in sides}
        for k in sides:
            if k != "torch":
                row[f"{k}_over_torch"] = per["torch"] / per[k]
        if "fused" in sides and "compile" in sides:
            row["fused_over_compile"] = per["compile"] / per["fused"]
        routed = pt.routing_report()
        row["routed_to_torch"] = sum(d["winner"] == "torch" for d in routed)
        row["kept_in_pycudnn"] = sum(d["winner"] == "pycudnn" for d in routed)
        out[f"batch{batch}"] = row
        others = "  ".join(f"{k} {row[k]['steps_per_s']:7.2f} ({row[f'{k}_over_torch']:.3f}x)"
                           for k in sides if k != "torch")
        warm = " / ".join(f"{first[k]:.1f}" for k in sides)
        print(f"{name:20} train b{batch:<4} torch {row['torch']['steps_per_s']:7.2f} steps/s  "
              f"{others}  (warm-up {args.warmup} steps {warm} s; signatures to torch "
              f"{row['routed_to_torch']}, kept {row['kept_in_pycudnn']})", flush=True)
        del sides, opts
        torch.cuda.empty_cache()
    return out


def graphed_step(model, opt, x, y):
    """A replay function of ``step`` captured in a CUDA graph (static ``x`` and ``y``), after
    warm-up steps on a side stream, as PyTorch's CUDA-graph notes capture a whole network."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step(model, opt, x, y)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)  # the gradients are allocated inside the graph's pool
    with torch.cuda.graph(g):
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return g.replay


def part_graph(name: str, args) -> dict:
    import pycudnn.torch as pt

    out: dict = {}
    for batch in args.batch:
        base = make(name, torch.bfloat16)
        makers = {"torch": lambda: copy.deepcopy(base),
                  "pycudnn": lambda: pt.convert(copy.deepcopy(base)),
                  "fused": lambda: pt.fuse_for_training(pt.convert(copy.deepcopy(base)))}
        (x, y), = data(batch, torch.bfloat16, count=1)
        replays, kept = {}, []
        for k in args.train_sides:
            if k in makers:
                m = makers[k]()
                opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
                kept.append((m, opt))  # a graph replays into their memory: keep them alive
                replays[k] = graphed_step(m, opt, x, y)
        del base
        per = alternate(replays, args.steps, args.rounds)
        row: dict = {k: {"steps_per_s": 1 / per[k]} for k in replays}
        for k in replays:
            if k != "torch":
                row[f"{k}_over_torch"] = per["torch"] / per[k]
        out[f"batch{batch}"] = row
        others = "  ".join(f"{k} {row[k]['steps_per_s']:7.2f} ({row[f'{k}_over_torch']:.3f}x)"
                           for k in replays if k != "torch")
        print(f"{name:20} graph b{batch:<4} torch {row['torch']['steps_per_s']:7.2f} steps/s  "
              f"{others}", flush=True)
        del replays, kept
        torch.cuda.empty_cache()
    return out


def part_infer(name: str, args) -> dict:
    import pycudnn.torch as pt

    model = make(name, torch.bfloat16).eval()
    (x, _), = data(args.infer_batch, torch.bfloat16, count=1)
    with torch.no_grad():
        fused = pt.fuse_for_inference(model)
        t0 = time.perf_counter()
        fused(x)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        for _ in range(3):
            model(x)
            fused(x)
        per = alternate({"torch": lambda: model(x), "pycudnn_fused": lambda: fused(x)},
                        args.infer_steps, args.rounds)
    row = {k: {"img_per_s": args.infer_batch / v} for k, v in per.items()}
    row["fused_over_torch"] = per["torch"] / per["pycudnn_fused"]
    row["fused_first_call_s"] = first
    print(f"{name:20} infer b{args.infer_batch:<4} torch {row['torch']['img_per_s']:9.0f} img/s  "
          f"fused {row['pycudnn_fused']['img_per_s']:9.0f}  ratio {row['fused_over_torch']:.3f}",
          flush=True)
    return row


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def part_check(name: str, args) -> dict:
    import pycudnn.torch as pt

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        base = make(name, torch.float32).train()
        ref = copy.deepcopy(base).double()
        (x, y), = data(4, torch.float32, count=1)
        outs = {}
        for k, m in (("torch", copy.deepcopy(base)), ("pycudnn", pt.convert(copy.deepcopy(base))),
                     ("float64", ref)):
            with torch.backends.cudnn.flags(enabled=k != "float64"):  # float64: PyTorch's own kernels
                logits = m(x.double() if k == "float64" else x)
                loss = F.cross_entropy(logits, y)
                loss.backward()
            conv = next(mm for mm in m.modules() if isinstance(mm, torch.nn.Conv2d))
            outs[k] = (logits.detach(), loss.detach(), conv.weight.grad.detach())
        row = {}
        for i, what in enumerate(("logits", "loss", "first_conv_grad")):
            e_torch = _rel(outs["torch"][i], outs["float64"][i])
            e_ours = _rel(outs["pycudnn"][i], outs["float64"][i])
            row[what] = {"pycudnn_err": e_ours, "torch_err": e_torch,
                         "within": e_ours <= max(4 * e_torch, 1e-6)}
        print(f"{name:20} check fp32  " + "  ".join(
            f"{w} {r['pycudnn_err']:.1e} (torch {r['torch_err']:.1e}) {'ok' if r['within'] else 'OVER'}"
            for w, r in row.items()), flush=True)
        return row
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def first_step_child(name: str, side: str, batch: int) -> None:
    """In a fresh process: one training step of ``side``, its seconds printed as JSON."""
    torch.backends.cudnn.benchmark = True
    model = make(name, torch.bfloat16)
    if side == "pycudnn":
        import pycudnn.torch as pt

        pt.convert(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    (x, y), = data(batch, torch.bfloat16, count=1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step(model, opt, x, y)
    torch.cuda.synchronize()
    print(json.dumps({"first_step_s": time.perf_counter() - t0}))


def part_first(name: str, args) -> dict:
    import tempfile

    row: dict = {}
    for side in ("torch", "pycudnn"):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, PYCUDNN_CACHE_DIR=cache)
            out = subprocess.run([sys.executable, __file__, "--first-child", side, "--models", name,
                                  "--batch", str(args.batch[0])], env=env, capture_output=True,
                                 text=True, timeout=600)
            if out.returncode:
                raise RuntimeError(f"{side} child failed: {out.stderr.strip().splitlines()[-1:]}")
            row[side] = json.loads(out.stdout.strip().splitlines()[-1])["first_step_s"]
    row["pycudnn_over_torch_time"] = row["pycudnn"] / row["torch"]
    print(f"{name:20} first step b{args.batch[0]:<4} torch {row['torch']:6.2f} s  pycudnn "
          f"{row['pycudnn']:6.2f} s", flush=True)
    return row


PARTS = {"train": part_train, "graph": part_graph, "infer": part_infer, "check": part_check,
         "first": part_first}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--parts", default="train,infer,check")
    ap.add_argument("--batch", default="64", help="training batch sizes, comma-separated")
    ap.add_argument("--train-sides", default="torch,pycudnn,fused",
                    help="training sides: torch (eager), pycudnn (convert), fused "
                         "(convert + fuse_for_training), compile (torch.compile of the plain model)")
    ap.add_argument("--infer-batch", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=3, help="first training steps, not timed")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed block")
    ap.add_argument("--infer-steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="timed blocks per side")
    ap.add_argument("--json", default=None)
    ap.add_argument("--first-child", choices=("torch", "pycudnn"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.batch = [int(b) for b in args.batch.split(",")]
    args.train_sides = ["torch"] + [k for k in args.train_sides.split(",") if k and k != "torch"]
    if not torch.cuda.is_available():
        sys.exit("zoo.py needs a CUDA build of PyTorch and an NVIDIA GPU")
    if args.first_child:
        first_step_child(args.models, args.first_child, args.batch[0])
        return 0
    torch.backends.cudnn.benchmark = True
    import pycudnn

    results: dict = {"commit": commit(), "device": torch.cuda.get_device_name(),
                     "torch": torch.__version__, "cudnn": pycudnn.version(),
                     "command": "benchmarks/zoo.py " + " ".join(argv or sys.argv[1:]), "models": {}}
    for name in args.models.split(","):
        row: dict = {}
        results["models"][name] = row
        for part in args.parts.split(","):
            try:
                row[part] = PARTS[part](name, args)
            except Exception as exc:  # noqa: BLE001 - one failing part must not stop the run
                row[part] = {"error": f"{type(exc).__name__}: {exc}"}
                traceback.print_exc()
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(results, f, indent=1)
            torch.cuda.empty_cache()
    train = [r["train"][f"batch{args.batch[0]}"]["pycudnn_over_torch"]
             for r in results["models"].values()
             if "train" in r and f"batch{args.batch[0]}" in r["train"]]
    if train:
        geo = statistics.geometric_mean(train)
        results["train_geomean"] = geo
        print(f"geomean training ratio (batch {args.batch[0]}): {geo:.3f}")
    fused = [r["train"][f"batch{args.batch[0]}"]["fused_over_torch"]
             for r in results["models"].values()
             if "train" in r and "fused_over_torch" in r["train"].get(f"batch{args.batch[0]}", {})]
    if fused:
        results["train_fused_geomean"] = statistics.geometric_mean(fused)
        print(f"geomean fused training ratio (batch {args.batch[0]}): "
              f"{results['train_fused_geomean']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
