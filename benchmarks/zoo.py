"""torchvision CNNs through ``pycudnn.torch`` against PyTorch eager, in one process.

Run on a GPU machine with PyTorch and torchvision (``weights=None``: nothing is downloaded):

    PYTHONPATH=. python3 benchmarks/zoo.py --json $OUT/zoo.json
    PYTHONPATH=. python3 benchmarks/zoo.py --models resnet50,convnext_tiny --parts train,infer
    PYTHONPATH=. python3 benchmarks/zoo.py --parts kernels --json $OUT/zoo_kernels.json

Per model, bfloat16 channels_last (``--dtype float16`` for the train and graph parts), both
sides with benchmark mode on (``torch.backends.cudnn.
benchmark = True``; pycudnn routes each convolution signature to the faster side, see
``pycudnn/torch/routing.py``), the same initial weights:

* ``train``: eager training steps/s (SGD, cross entropy over 1000 classes, synthetic data) at each
  ``--batch``; "pycudnn" is the model after ``pycudnn.torch.convert``. The first steps of each side
  (their searches; PyTorch's side first, so pycudnn's finds PyTorch's own search done) are
  timed as ``warmup_s`` and then kept out: timed blocks alternate
  between the sides after warm-up, and each side's figure is the median block.
  "fused" is the converted model after ``pycudnn.torch.fuse_for_training`` (Conv-BN[-add]-ReLU
  as one node with cuDNN's fused batch-norm kernels); "chains" fuses with
  ``into_convolutions=True`` (each Conv-BN-ReLU-Conv link's batch norm into the convolutions,
  the rest as "fused"; ``chain_plans`` says per graph kind how many layouts got a plan and how
  many cuDNN refused). ``--train-sides`` adds ``torch.compile``:
  "compile" (the plain model, default mode), "fused_compile" (the fused model compiled; its
  blocks are traced as pycudnn's operators), "compile_ro" and "fused_compile_ro" (the same with
  ``mode="reduce-overhead"``: CUDA graphs; each step marks a new step for them). Each compiled
  fused side is also given over its plain compiled side (``fused_compile_over_compile``).
* ``infer``: inference img/s at ``--infer-batch``, eval mode, no grad: PyTorch eager against
  ``pycudnn.torch.fuse_for_inference`` (BatchNorm folded, Conv-BN-ReLU fused; in benchmark mode
  each fused signature runs on the side its first call measured faster); ``--infer-sides`` adds
  "compile" (``torch.compile`` of the plain model) and "fused_compile" (of the fused one).
* ``graph``: the training step captured whole in a CUDA graph (PyTorch's whole-network capture:
  forward, backward and the optimizer step; static input), steps/s of graph replays: the GPU's
  time alone, no host launch cost, for each of ``--train-sides`` but "compile".
* ``first``: the first training step of a fresh process with an empty tuning database
  (``PYCUDNN_CACHE_DIR`` a new temporary folder), each side in its own subprocess, timed from
  the step's start (CUDA context, model and data already made) to its end.
* ``check``: float32 with TF32 off, batch 4: the logits, the loss and the first convolution's
  weight gradient of the converted model against PyTorch's, each as a relative error next to
  PyTorch's own distance from a float64 run (the bound a pycudnn error should stay within).
* ``kernels`` (not in the default ``--parts``): the distinct convolutions the model runs at the
  first ``--batch`` in bfloat16 channels_last (forward pre-hooks on every ``nn.Conv2d``, one
  training-mode forward; each signature with the layers that share it), each timed forward /
  backward data / backward filter, pycudnn's functions against PyTorch's, kernel time with the
  host far ahead exactly as ``conv_vs_torch.py`` times it (its ``_calls`` and ``measure_cell``:
  gated batches, sides alternating, both searching; ``--kernel-reps`` calls x
  ``--kernel-batches`` batches, its ``--quick`` settings by default). Backward data is left out
  where no layer of the signature needs it in training (the stem: its input needs no
  gradient). A signature is timed once per run and reported under every model that has it.
  Ratios here are torch / pycudnn time (above 1: pycudnn is faster); per model and over the
  run's distinct cells: the geomean, the cells below 0.90 (issue 23's targets: geomean >= 1.02,
  no cell below 0.90) and ``time_ratio``, PyTorch's over pycudnn's summed kernel time with each
  signature weighted by its layer count.

Ratios are pycudnn over PyTorch throughput (``kernels``: torch over pycudnn time): above 1 means
pycudnn is faster. Results (and the commit they were measured at) go to ``--json``; a part that
fails records its error and the run goes on.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import conv_vs_torch  # this script's folder is on sys.path
import gpu_timing
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


TRAIN_SIDES = ("torch", "pycudnn", "fused", "chains", "compile", "fused_compile", "compile_ro",
               "fused_compile_ro")
INFER_SIDES = ("torch", "fused", "compile", "fused_compile")


def _compile_mode(side: str) -> str | None:
    """``torch.compile``'s mode for a side name (None: not compiled)."""
    if "compile" not in side:
        return None
    return "reduce-overhead" if side.endswith("_ro") else "default"


def training_side(side: str, base: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``base`` as training side ``side`` (see ``--train-sides``) trains it."""
    import pycudnn.torch as pt

    if side not in TRAIN_SIDES:
        raise ValueError(f"--train-sides: expected each of {', '.join(TRAIN_SIDES)}, got {side!r}")
    model = copy.deepcopy(base)
    if side != "torch" and not side.startswith("compile"):
        model = pt.convert(model)
        if side.startswith("fused"):
            model = pt.fuse_for_training(model)
        elif side == "chains":
            model = pt.fuse_for_training(model, into_convolutions=True)
    mode = _compile_mode(side)
    return model if mode is None else torch.compile(model, mode=mode)


def side_step(side: str) -> Callable[..., None]:
    """``step`` for ``side``: a reduce-overhead side marks each step's start first (its CUDA
    graphs' outputs of the last step are then free to overwrite)."""
    if _compile_mode(side) != "reduce-overhead":
        return step

    def marked(model, opt, x, y) -> None:
        torch.compiler.cudagraph_mark_step_begin()
        step(model, opt, x, y)
    return marked


def train_geomeans(models: dict, batch: str) -> dict[str, float]:
    """The geomean over ``models`` of each training ratio to PyTorch eager that any of them has
    at ``batch`` ("batch64"), as ``train_<side>_geomean`` (``train_geomean`` for convert)."""
    ratios: dict[str, list[float]] = {}
    for r in models.values():
        for key, v in r.get("train", {}).get(batch, {}).items():
            if key.endswith("_over_torch") and isinstance(v, float):
                ratios.setdefault(key[:-len("_over_torch")], []).append(v)
    return {("train_geomean" if side == "pycudnn" else f"train_{side}_geomean"):
            statistics.geometric_mean(v) for side, v in ratios.items()}


def part_train(name: str, args) -> dict:
    import pycudnn.torch as pt

    out: dict = {}
    for batch in args.batch:
        pt.routing.clear_report()
        base = make(name, args.train_dtype)
        sides = {k: training_side(k, base) for k in args.train_sides}
        del base
        opts = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in sides.items()}
        batches = data(batch, args.train_dtype)
        steps = {k: side_step(k) for k in sides}
        first = {}
        for k, m in sides.items():
            t0 = time.perf_counter()
            for i in range(args.warmup):
                steps[k](m, opts[k], *batches[i % 2])
            torch.cuda.synchronize()
            first[k] = time.perf_counter() - t0
        it = {k: iter(range(10**9)) for k in sides}
        fns = {k: (lambda k=k: steps[k](sides[k], opts[k], *batches[next(it[k]) % 2]))
               for k in sides}
        per = alternate(fns, args.steps, args.rounds)
        row = {k: {"steps_per_s": 1 / per[k], "warmup_s": first[k]} for k in sides}
        for k in sides:
            if k != "torch":
                row[f"{k}_over_torch"] = per["torch"] / per[k]
        if "fused" in sides and "compile" in sides:
            row["fused_over_compile"] = per["compile"] / per["fused"]
        for plain, fused_side in (("compile", "fused_compile"), ("compile_ro", "fused_compile_ro")):
            if plain in sides and fused_side in sides:
                row[f"{fused_side}_over_{plain}"] = per[plain] / per[fused_side]
        decisions = pt.routing_report()
        routed = [d for d in decisions if d["direction"] != "block"]
        blocks = [d for d in decisions if d["direction"] == "block"]
        row["routed_to_torch"] = sum(d["winner"] == "torch" for d in routed)
        row["kept_in_pycudnn"] = sum(d["winner"] == "pycudnn" for d in routed)
        row["kept"] = [d for d in routed if d["winner"] == "pycudnn"]
        row["blocks"] = blocks  # fuse_for_training's blocks: fused ("pycudnn") or as modules
        if "chains" in sides:  # per graph kind, layouts with a plan and layouts cuDNN refused
            from pycudnn.torch import conv_chains
            row["chain_plans"] = conv_chains.CUDNN_KERNELS.counts()
        out[f"batch{batch}"] = row
        others = "  ".join(f"{k} {row[k]['steps_per_s']:7.2f} ({row[f'{k}_over_torch']:.3f}x)"
                           for k in sides if k != "torch")
        warm = " / ".join(f"{first[k]:.1f}" for k in sides)
        fused_blocks = sum(d["winner"] == "pycudnn" for d in blocks)
        print(f"{name:20} train b{batch:<4} torch {row['torch']['steps_per_s']:7.2f} steps/s  "
              f"{others}  (warm-up {args.warmup} steps {warm} s; signatures to torch "
              f"{row['routed_to_torch']}, kept {row['kept_in_pycudnn']}; blocks fused "
              f"{fused_blocks}, as modules {len(blocks) - fused_blocks})", flush=True)
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
    out: dict = {}
    for batch in args.batch:
        base = make(name, args.train_dtype)
        (x, y), = data(batch, args.train_dtype, count=1)
        replays, kept = {}, []
        for k in args.train_sides:
            if _compile_mode(k) is None:  # a compiled side's own CUDA graphs: not captured again
                m = training_side(k, base)
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

    pt.routing.clear_report()
    model = make(name, torch.bfloat16).eval()
    (x, _), = data(args.infer_batch, torch.bfloat16, count=1)
    with torch.no_grad():
        fused = pt.fuse_for_inference(model)
        t0 = time.perf_counter()
        fused(x)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        fns = {"torch": model, "pycudnn_fused": fused}
        if "compile" in args.infer_sides:
            fns["compile"] = torch.compile(model)
        if "fused_compile" in args.infer_sides:
            fns["fused_compile"] = torch.compile(fused)
        for _ in range(3):  # the compiled sides compile here
            for m in fns.values():
                m(x)
        per = alternate({k: (lambda m=m: m(x)) for k, m in fns.items()}, args.infer_steps,
                        args.rounds)
    row: dict = {k: {"img_per_s": args.infer_batch / v} for k, v in per.items()}
    row["fused_over_torch"] = per["torch"] / per["pycudnn_fused"]
    if "compile" in per:
        row["fused_over_compile"] = per["compile"] / per["pycudnn_fused"]
        if "fused_compile" in per:
            row["fused_compile_over_compile"] = per["compile"] / per["fused_compile"]
    row["fused_first_call_s"] = first
    routed = [d for d in pt.routing_report() if d["signature"].startswith("conv2d_")]
    row["fused_calls_to_torch"] = sum(d["winner"] == "torch" for d in routed)
    row["fused_calls_kept"] = sum(d["winner"] == "pycudnn" for d in routed)
    others = "  ".join(f"{k} {row[k]['img_per_s']:9.0f}" for k in per if k not in ("torch", "pycudnn_fused"))
    print(f"{name:20} infer b{args.infer_batch:<4} torch {row['torch']['img_per_s']:9.0f} img/s  "
          f"fused {row['pycudnn_fused']['img_per_s']:9.0f}  ratio {row['fused_over_torch']:.3f}  "
          f"{others}  (fused signatures to torch {row['fused_calls_to_torch']}, kept "
          f"{row['fused_calls_kept']})", flush=True)
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
    """In a fresh process: one training step of ``side``, its seconds printed as JSON (for
    pycudnn, with how routing decided the signatures: measured, taken from the stored decisions,
    or given to PyTorch unsearched)."""
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
    out: dict[str, Any] = {"first_step_s": time.perf_counter() - t0}
    if side == "pycudnn":
        decisions = pt.routing_report()
        out["routing"] = {
            "to_torch": sum(d["winner"] == "torch" for d in decisions),
            "kept": sum(d["winner"] == "pycudnn" for d in decisions),
            "stored": sum(d["reason"].startswith("stored: ") for d in decisions),
            "unsearched": sum("not searched" in d["reason"] for d in decisions)}
    print(json.dumps(out))


def part_first(name: str, args) -> dict:
    """The first training step of a fresh process (batch ``--batch``): PyTorch's, pycudnn's with
    an empty tuning database, and pycudnn's again in a second process on the database (and
    routing decisions) the first one left."""
    import tempfile

    row: dict = {}
    runs = (("torch", "torch"), ("pycudnn", "pycudnn"), ("pycudnn_filled_db", "pycudnn"))
    with tempfile.TemporaryDirectory() as cache:
        for label, side in runs:
            env = dict(os.environ, PYCUDNN_CACHE_DIR=os.path.join(cache, side))
            out = subprocess.run([sys.executable, __file__, "--first-child", side, "--models", name,
                                  "--batch", str(args.batch[0])], env=env, capture_output=True,
                                 text=True, timeout=600)
            if out.returncode:
                raise RuntimeError(f"{label} child failed: {out.stderr.strip().splitlines()[-1:]}")
            got = json.loads(out.stdout.strip().splitlines()[-1])
            row[label] = got["first_step_s"]
            if "routing" in got:
                row[f"{label}_routing"] = got["routing"]
    row["pycudnn_over_torch_time"] = row["pycudnn"] / row["torch"]
    row["filled_db_over_torch_time"] = row["pycudnn_filled_db"] / row["torch"]
    print(f"{name:20} first step b{args.batch[0]:<4} torch {row['torch']:6.2f} s  pycudnn "
          f"{row['pycudnn']:6.2f} s  (filled tuning database {row['pycudnn_filled_db']:6.2f} s)",
          flush=True)
    return row


# ---- kernels: the distinct convolutions, kernel time against PyTorch's ------------------------------

KERNEL_CONFIG = "bf16-nhwc"  # conv_vs_torch's config: bfloat16 channels_last, TF32 allowed
GEOMEAN_TARGET = 1.02  # issue 23: geomean torch/pycudnn at least this, no cell below conv_vs_torch.BELOW


@dataclass(frozen=True)
class ConvSignature:
    """One convolution as the GPU runs it: input ``(n, c, h, w)``, ``k`` filters of ``r x s``,
    stride, padding and dilation as (height, width) pairs, ``groups``."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1

    @property
    def pad(self) -> tuple[int, int]:  # the name conv_vs_torch._calls reads
        return self.padding

    @property
    def out_hw(self) -> tuple[int, int]:
        return tuple((i + 2 * p - d * (k - 1) - 1) // st + 1  # type: ignore[return-value]
                     for i, k, st, p, d in zip((self.h, self.w), (self.r, self.s), self.stride,
                                               self.padding, self.dilation))

    @property
    def x_shape(self) -> tuple[int, ...]:
        return (self.n, self.c, self.h, self.w)

    @property
    def w_shape(self) -> tuple[int, ...]:
        return (self.k, self.c // self.groups, self.r, self.s)

    @property
    def y_shape(self) -> tuple[int, ...]:
        return (self.n, self.k) + self.out_hw

    @property
    def flops(self) -> int:
        """2 * N * K * C/groups * R * S * output pixels: the same in every direction."""
        return 2 * self.n * self.k * (self.c // self.groups) * self.r * self.s * math.prod(self.out_hw)

    def shape_string(self) -> str:
        """``N,C,H,W,K,R,S,stride,pad[,dilation,groups]`` (``pycudnn bench --shape``) where stride,
        padding and dilation are the same along both dims; else each as ``HxW``."""
        parts = [self.stride, self.padding, self.dilation]
        if all(a == b for a, b in parts):
            st, pd, dl = (a for a, _ in parts)
        else:
            st, pd, dl = ("x".join(map(str, p)) for p in parts)
        out = [self.n, self.c, self.h, self.w, self.k, self.r, self.s, st, pd]
        if self.dilation != (1, 1) or self.groups != 1:
            out += [dl, self.groups]
        return ",".join(map(str, out))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class CollectedConv:
    """A distinct signature of one model: the layers (module names) that run it, how many calls
    of them one forward makes, and whether any needs its input's gradient (backward data)."""

    signature: ConvSignature
    layers: list[str]
    calls: int = 0
    input_grad: bool = False

    @property
    def count(self) -> int:
        return len(self.layers)


def _hw_pair(value: Any, what: str) -> tuple[int, int]:
    pair = (int(value),) * 2 if isinstance(value, int) else tuple(int(v) for v in value)
    if len(pair) != 2:
        raise ValueError(f"{what}: expected an int or a pair for a 2-D convolution, got {value!r}")
    return pair  # type: ignore[return-value]


def conv_signature(module: torch.nn.Conv2d, x: torch.Tensor) -> ConvSignature:
    """The convolution ``module`` runs on input ``x`` (``padding_mode`` other than zeros pads
    ``x`` first and convolves with no padding, as ``nn.Conv2d`` does)."""
    if x.dim() != 4:
        raise ValueError(f"x: expected a 4-D (N, C, H, W) input of {module}, got shape {tuple(x.shape)}")
    n, c, h, w = (int(v) for v in x.shape)
    r, s = (int(v) for v in module.kernel_size)
    dilation = _hw_pair(module.dilation, "dilation")
    if isinstance(module.padding, str):  # "valid" or "same" (stride 1)
        if module.padding == "valid":
            padding = (0, 0)
        else:
            total = [d * (k - 1) for d, k in zip(dilation, (r, s))]
            if any(t % 2 for t in total):
                raise ValueError(f"padding: 'same' with an odd total padding {total} pads one side "
                                 f"more, which this signature cannot hold ({module})")
            padding = (total[0] // 2, total[1] // 2)
    else:
        padding = _hw_pair(module.padding, "padding")
    if module.padding_mode != "zeros":
        h, w, padding = h + 2 * padding[0], w + 2 * padding[1], (0, 0)
    return ConvSignature(n, c, h, w, int(module.out_channels), r, s,
                         _hw_pair(module.stride, "stride"), padding, dilation, int(module.groups))


def collect_convolutions(model: torch.nn.Module, *inputs: Any) -> list[CollectedConv]:
    """The distinct convolutions one forward of ``model(*inputs)`` runs, in order of first use:
    forward pre-hooks on every ``torch.nn.Conv2d`` record each call's signature. Works on any
    device, the meta device included; the model's mode (train/eval) and grad mode are the
    caller's (under ``torch.no_grad`` no input needs a gradient, so ``input_grad`` is False)."""
    found: dict[ConvSignature, CollectedConv] = {}
    names = {m: name for name, m in model.named_modules()}

    def hook(module: torch.nn.Module, args: tuple) -> None:
        x = args[0]
        sig = conv_signature(module, x)  # type: ignore[arg-type]
        entry = found.setdefault(sig, CollectedConv(sig, []))
        name = names.get(module, type(module).__name__)
        if name not in entry.layers:
            entry.layers.append(name)
        entry.calls += 1
        entry.input_grad = entry.input_grad or bool(x.requires_grad)

    handles = [m.register_forward_pre_hook(hook) for m in model.modules()
               if isinstance(m, torch.nn.Conv2d)]
    try:
        model(*inputs)
    finally:
        for hd in handles:
            hd.remove()
    return list(found.values())


def kernel_directions(conv: CollectedConv) -> list[str]:
    """The directions training runs for ``conv``: backward data only where an input needs it."""
    return [d for d in conv_vs_torch.DIRECTIONS if d != "dgrad" or conv.input_grad]


def model_kernel_cells(convs: Sequence[CollectedConv], cache: dict[tuple[str, str], dict[str, Any]],
                       measure: Callable[[ConvSignature, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """One cell per signature and direction of a model, ``measure(signature, direction)`` called
    only for those not yet in ``cache`` (keyed by shape string and direction; shared across the
    models of a run). Each returned cell is a copy with this model's layer count and names."""
    out = []
    for conv in convs:
        key_shape = conv.signature.shape_string()
        for d in kernel_directions(conv):
            key = (key_shape, d)
            if key not in cache:
                cache[key] = measure(conv.signature, d)
            out.append(dict(cache[key], layers=conv.count, layer_names=list(conv.layers)))
    return out


def _timed(cells: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in cells if isinstance(c.get("ratio"), float) and math.isfinite(c["ratio"])
            and c.get("torch_us") and c.get("pycudnn_us")]


def kernel_summary(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """conv_vs_torch's summary of ``cells`` (geomean torch/pycudnn, min, cells below 0.90, failed
    cells), plus ``time_ratio`` (summed PyTorch time over summed pycudnn time, each cell weighted
    by its ``layers``) and ``meets_target`` (geomean >= 1.02 and no cell below 0.90)."""
    s = conv_vs_torch.summarize(cells)
    s.pop("per_config", None)
    ok = _timed(cells)
    t = sum(c["torch_us"] * c.get("layers", 1) for c in ok)
    p = sum(c["pycudnn_us"] * c.get("layers", 1) for c in ok)
    s["time_ratio"] = gpu_timing.ratio(t, p)
    g = s["geomean"]
    s["meets_target"] = bool(ok) and math.isfinite(g) and g >= GEOMEAN_TARGET and not s["below"] \
        and not s["errors"]
    return s


def overall_kernel_summary(model_cells: dict[str, Sequence[dict[str, Any]]]) -> dict[str, Any]:
    """`kernel_summary` over the distinct cells of all models (a signature and direction counted
    once, its ``layers`` summed over the models that have it); ``models``: which have each cell
    below 0.90 is in the per-model summaries."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for cells in model_cells.values():
        for c in cells:
            key = (c["shape"], c["direction"])
            if key in merged:
                merged[key]["layers"] += c.get("layers", 1)
            else:
                merged[key] = dict(c, layers=c.get("layers", 1))
    s = kernel_summary(list(merged.values()))
    s["models"] = list(model_cells)
    return s


def format_kernel_table(name: str, convs: Sequence[CollectedConv], cells: Sequence[dict[str, Any]]) -> str:
    """One model's cells (Markdown): shape, layers sharing it, direction, both times, the ratio."""
    fmt = conv_vs_torch._fmt
    lines = [f"{name}: {len(convs)} distinct convolutions ({sum(c.count for c in convs)} layers), {KERNEL_CONFIG}",
             "| shape N,C,H,W,K,R,S,stride,pad[,dil,groups] | layers | dir | torch us | pycudnn us | torch/pycudnn |",
             "|---|---|---|---|---|---|"]
    by_shape: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        by_shape.setdefault(c["shape"], []).append(c)
    for conv in convs:
        shape = conv.signature.shape_string()
        for c in by_shape.get(shape, []):
            note = f" ({c['error']})" if c.get("error") else ""
            mark = " **<0.90**" if isinstance(c.get("ratio"), float) and c["ratio"] < conv_vs_torch.BELOW else ""
            lines.append(f"| {shape} | {conv.count} | {c['direction']} | {fmt(c.get('torch_us'), '.2f')} | "
                         f"{fmt(c.get('pycudnn_us'), '.2f')} | {fmt(c.get('ratio'), '.3f')}{note}{mark} |")
        if not conv.input_grad:
            lines.append(f"| {shape} | {conv.count} | dgrad | - | - | not run in training |")
    return "\n".join(lines)


def format_kernel_summary(label: str, s: dict[str, Any]) -> str:
    mn = s.get("min")
    below = s["below"]
    return (f"{label}: geomean torch/pycudnn {conv_vs_torch._fmt(s['geomean'], '.3f')} over {s['timed']} "
            f"of {s['cells']} cells, time ratio {conv_vs_torch._fmt(s['time_ratio'], '.3f')}, min "
            + (f"{mn['ratio']:.3f} ({mn['cell']})" if mn else "-")
            + f"; below {conv_vs_torch.BELOW:.2f}: {len(below)}" + (f" ({', '.join(below)})" if below else "")
            + (f"; failed {len(s['errors'])}" if s["errors"] else "")
            + f"; target (geomean >= {GEOMEAN_TARGET}, none below {conv_vs_torch.BELOW:.2f}) "
            + ("met" if s["meets_target"] else "not met"))


def _kernel_timing(args: argparse.Namespace) -> dict[str, Any]:
    """What measuring needs, made once per run: the gate, conv_vs_torch's flags and settings."""
    import pycudnn

    dtype_name, channels_last, tf32 = conv_vs_torch.CONFIGS[KERNEL_CONFIG]
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
    return {"pycudnn": pycudnn, "dtype": getattr(torch, dtype_name),
            "format": torch.channels_last if channels_last else torch.contiguous_format,
            "flags": {"benchmark": True, "allow_tf32": tf32, "engine": "graph", "tuning_db": False},
            "gate": gpu_timing.get_gate(torch.cuda.current_device(), torch, "auto"),
            "settings": argparse.Namespace(reps=args.kernel_reps, batches=args.kernel_batches,
                                           no_kernel_names=not args.kernel_names),
            "tensors": {}, "count": 0, "t0": time.perf_counter()}


def _measure_signature(sig: ConvSignature, direction: str, k: dict[str, Any]) -> dict[str, Any]:
    """One cell, timed by conv_vs_torch.measure_cell (errors in the cell, the run goes on)."""
    row: dict[str, Any] = {"config": KERNEL_CONFIG, "layer": sig.shape_string(), "shape": sig.shape_string(),
                           "direction": direction, "signature": sig.to_dict(), "gflop": sig.flops / 1e9,
                           "first": "torch" if k["count"] % 2 == 0 else "pycudnn"}
    k["count"] += 1
    print(f"  [{k['count']}] {sig.shape_string()} {direction} ({time.perf_counter() - k['t0']:.0f} s)",
          file=sys.stderr, flush=True)
    try:
        tensors = k["tensors"]
        if tensors.get("sig") != sig:
            tensors.clear()
            dt, fmt = k["dtype"], k["format"]
            tensors.update(sig=sig,
                           x=torch.randn(sig.x_shape, device="cuda", dtype=dt).to(memory_format=fmt),
                           w=(torch.randn(sig.w_shape, device="cuda", dtype=dt) * 0.05).to(memory_format=fmt),
                           dy=torch.randn(sig.y_shape, device="cuda", dtype=dt).to(memory_format=fmt))
        stream = torch.cuda.current_stream()
        tfn, pfn = conv_vs_torch._calls(torch, F, k["pycudnn"], sig, direction, tensors["x"], tensors["w"],
                                        tensors["dy"], k["flags"], stream)
        conv_vs_torch.measure_cell(torch, k["pycudnn"], row, tfn, pfn, k["settings"], k["gate"], row["first"])
    except Exception as exc:  # noqa: BLE001 - a failing cell is reported, the run goes on
        row["error"] = gpu_timing.error_text(exc)
        torch.cuda.synchronize()
    if row.get("error"):
        print(f"    error: {row['error']}", file=sys.stderr)
    else:
        print(f"    torch {row['torch_us']:.2f} us, pycudnn {row['pycudnn_us']:.2f} us, "
              f"torch/pycudnn {row['ratio']:.3f}", file=sys.stderr)
    return row


def part_kernels(name: str, args) -> dict:
    if args.kernel_state is None:
        args.kernel_state = _kernel_timing(args)
    k = args.kernel_state
    batch = args.batch[0]
    model = make(name, k["dtype"]).train()
    (x, _), = data(batch, k["dtype"], count=1)
    convs = collect_convolutions(model, x)  # grad on: which inputs need their gradient
    del model, x
    torch.cuda.empty_cache()
    cells = model_kernel_cells(convs, args.kernel_cells,
                               lambda sig, d: _measure_signature(sig, d, k))
    k["tensors"].clear()
    summary = kernel_summary(cells)
    print(format_kernel_table(name, convs, cells))
    print(format_kernel_summary(name, summary), flush=True)
    return {"config": KERNEL_CONFIG, "batch": batch, "reps": args.kernel_reps,
            "batches": args.kernel_batches, "gate": k["gate"].describe(),
            "signatures": [{**c.signature.to_dict(), "shape": c.signature.shape_string(),
                            "layers": c.count, "layer_names": c.layers, "calls": c.calls,
                            "dgrad_in_training": c.input_grad} for c in convs],
            "cells": cells, "summary": summary}


PARTS = {"train": part_train, "graph": part_graph, "infer": part_infer, "check": part_check,
         "first": part_first, "kernels": part_kernels}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--parts", default="train,infer,check")
    ap.add_argument("--batch", default="64", help="training batch sizes, comma-separated")
    ap.add_argument("--train-sides", default="torch,pycudnn,fused",
                    help="training sides: torch (eager), pycudnn (convert), fused "
                         "(convert + fuse_for_training), chains (the same with into_convolutions=True), "
                         "compile (torch.compile of the plain model), "
                         "fused_compile (of the fused one), compile_ro and fused_compile_ro "
                         "(mode='reduce-overhead')")
    ap.add_argument("--infer-sides", default="torch,fused",
                    help="inference sides: torch (eager) and fused (fuse_for_inference), always; "
                         "compile and fused_compile (torch.compile of either)")
    ap.add_argument("--infer-batch", type=int, default=128)
    ap.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16",
                    help="the train and graph parts' data type (cuDNN's batch-norm fusion "
                         "graphs behind the \"chains\" side have backward engines in float16, "
                         "in bfloat16 at some shapes only)")
    ap.add_argument("--warmup", type=int, default=3, help="first training steps, not timed")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed block")
    ap.add_argument("--infer-steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="timed blocks per side")
    ap.add_argument("--kernel-reps", type=int, default=conv_vs_torch.QUICK["reps"],
                    help="kernels: calls per gated batch (default %(default)s, conv_vs_torch --quick)")
    ap.add_argument("--kernel-batches", type=int, default=conv_vs_torch.QUICK["batches"],
                    help="kernels: gated batches per side and cell (default %(default)s)")
    ap.add_argument("--kernel-names", action="store_true",
                    help="kernels: record each side's kernel names (a torch.profiler pass per cell)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--first-child", choices=("torch", "pycudnn"), help=argparse.SUPPRESS)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    args.batch = [int(b) for b in args.batch.split(",")]
    args.train_sides = ["torch"] + [k for k in args.train_sides.split(",") if k and k != "torch"]
    args.infer_sides = [k for k in args.infer_sides.split(",") if k]
    bad = [k for k in args.infer_sides if k not in INFER_SIDES]
    if bad:
        ap.error(f"--infer-sides: unknown side {bad[0]!r}; expected a comma-separated list of "
                 f"{', '.join(INFER_SIDES)}")
    unknown = [p for p in args.parts.split(",") if p not in PARTS]
    if unknown:
        ap.error(f"--parts: unknown part {unknown[0]!r}; expected a comma-separated list of "
                 f"{', '.join(PARTS)}")
    try:
        gpu_timing.check_positive_int("--kernel-reps", args.kernel_reps)
        gpu_timing.check_positive_int("--kernel-batches", args.kernel_batches)
    except (TypeError, ValueError) as exc:
        ap.error(str(exc))
    args.train_dtype = getattr(torch, args.dtype)
    args.kernel_cells, args.kernel_state = {}, None  # kernels: cells timed so far, shared by the models
    if not torch.cuda.is_available():
        sys.exit("zoo.py needs a CUDA build of PyTorch and an NVIDIA GPU")
    if args.first_child:
        first_step_child(args.models, args.first_child, args.batch[0])
        return 0
    torch.backends.cudnn.benchmark = True
    import pycudnn

    results: dict = {"commit": commit(), "device": torch.cuda.get_device_name(),
                     "torch": torch.__version__, "cudnn": pycudnn.cudnn_version(),
                     "train_dtype": args.dtype,
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
                    json.dump(results, f, indent=1, default=str)
            torch.cuda.empty_cache()
    for key, ratio in train_geomeans(results["models"], f"batch{args.batch[0]}").items():
        results[key] = ratio
        print(f"{key.replace('_', ' ')} (batch {args.batch[0]}): {ratio:.3f}")
    kernel_cells = {n: r["kernels"]["cells"] for n, r in results["models"].items()
                    if "cells" in r.get("kernels", {})}
    if kernel_cells:
        results["kernels_summary"] = overall_kernel_summary(kernel_cells)
        print(format_kernel_summary(f"all {len(kernel_cells)} models, distinct cells",
                                    results["kernels_summary"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
