"""ResNet-50 through pycudnn.torch against PyTorch: training steps, CUDA graphs, the first step of a
fresh process, fused inference, and the host cost of one call.

Run on a GPU machine with PyTorch (torchvision is not needed: the model is defined here):

    PYTHONPATH=. python benchmarks/resnet50.py --quick --json $OUT/resnet50.json
    PYTHONPATH=. python benchmarks/resnet50.py --train --graph        # parts on their own

ResNet-50 v1.5 (torchvision's layout: stride on the 3x3 of each bottleneck), bfloat16 weights and
activations, channels_last, synthetic data from a fixed seed, SGD (lr 0.1, momentum 0.9), cross
entropy over 1000 classes. "pycudnn" is the same model after ``pycudnn.torch.convert`` (every
convolution, forward and both backward passes, in pycudnn with ``benchmark=True``); "torch" is
PyTorch eager with ``torch.backends.cudnn.benchmark = True``. Both start from the same weights.

Parts (all when none is named):

* ``--train``: steps/s of the eager training step, and the loss of the first 20 steps of both
  (same data) to show they train alike.
* ``--loss``: the first 20 steps' loss of both in float32 with TF32 off and deterministic
  algorithms (batch 32), where rounding differences grow slowly enough to compare the curves.
* ``--graph``: the whole training step captured in a CUDA graph on both sides (PyTorch's recipe:
  warm-up on a side stream, ``torch.cuda.graph`` with static inputs), replays/s.
* ``--first-step``: the first training step of a fresh process with an empty tuning database
  (``PYCUDNN_CACHE_DIR`` a new temporary folder), for both sides, in subprocesses.
* ``--infer``: inference at batch 128 with BatchNorm folded: ``pycudnn.torch.fuse_for_inference``
  (conv+bias+relu and conv+add+relu fused) against PyTorch eager and ``torch.compile`` (default
  mode; compiling takes about a minute; ``--no-compile`` skips it), img/s.
* ``--host``: host time per call of a tiny convolution (the GPU idle), pycudnn.torch against
  ``F.conv2d``, forward alone and forward + backward.

Timing: CUDA events over N steps after warm-up, the median of several repeats (``--quick``:
fewer steps and repeats; about 3 to 5 minutes without torch.compile).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- the model: ResNet-50 v1.5, torchvision's names and layout -----------------------------------


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(64, 3)
        self.layer2 = self._layer(128, 4, 2)
        self.layer3 = self._layer(256, 6, 2)
        self.layer4 = self._layer(512, 3, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2048, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        down = None
        if stride != 1 or self.inplanes != planes * 4:
            down = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride, bias=False),
                                 nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, down)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


DTYPE = torch.bfloat16
CL = torch.channels_last


def make_model(seed: int = 0, dtype: torch.dtype = DTYPE) -> nn.Module:
    torch.manual_seed(seed)
    return ResNet50().cuda().to(dtype, memory_format=CL)


def make_data(batch: int, count: int, seed: int = 1,
              dtype: torch.dtype = DTYPE) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.randn(batch, 3, 224, 224, device="cuda", generator=g).to(dtype, memory_format=CL),
             torch.randint(0, 1000, (batch,), device="cuda", generator=g)) for _ in range(count)]


def pycudnn_side(model: nn.Module) -> nn.Module:
    import pycudnn
    import pycudnn.torch as pt

    pycudnn.config.benchmark = True  # global: the autograd thread's calls see it too
    return pt.convert(model)


def train_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def timed(fn, steps: int, repeats: int) -> float:
    """Median seconds per call over ``repeats`` runs of ``steps`` calls (CUDA events)."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / steps)
    return statistics.median(times)


# ---- parts ----------------------------------------------------------------------------------------

def part_train(args) -> dict:
    base = make_model()
    data = make_data(args.batch, 4)
    sides = {"torch": copy.deepcopy(base), "pycudnn": pycudnn_side(copy.deepcopy(base))}
    del base
    result: dict = {"batch": args.batch}
    losses = {}
    for name, model in sides.items():
        opt = sgd(model)
        curve = []
        t0 = time.perf_counter()
        for i in range(args.curve):  # also the warm-up (searches on the first steps)
            curve.append(float(train_step(model, opt, *data[i % len(data)])))
        torch.cuda.synchronize()
        losses[name] = curve
        it = iter(range(10**9))
        per_step = timed(lambda: train_step(model, opt, *data[next(it) % len(data)]),
                         args.steps, args.repeats)
        result[name] = {"steps_per_s": 1.0 / per_step, "ms_per_step": per_step * 1e3,
                        "curve_s": time.perf_counter() - t0}
        print(f"train  {name:8} {1.0 / per_step:7.2f} steps/s ({per_step * 1e3:.2f} ms/step)",
              flush=True)
    result["pycudnn_over_torch"] = result["pycudnn"]["steps_per_s"] / result["torch"]["steps_per_s"]
    result["losses"] = losses
    diff = max(abs(a - b) / abs(b) for a, b in zip(losses["pycudnn"], losses["torch"]))
    result["loss_max_rel_diff"] = diff
    print(f"train  pycudnn / torch: {result['pycudnn_over_torch']:.3f}x")
    print("loss   step   torch    pycudnn")
    for i, (a, b) in enumerate(zip(losses["torch"], losses["pycudnn"])):
        print(f"       {i:4d}  {a:8.4f} {b:8.4f}")
    print(f"loss   largest relative difference over {len(losses['torch'])} steps: {diff:.2e} "
          f"(bfloat16: different algorithms round differently)", flush=True)
    return result


def part_loss(args) -> dict:
    """The loss curve in float32, TF32 off and deterministic algorithms on both sides: what is
    left of the difference between the two is rounding order, not a different computation."""
    import pycudnn

    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.deterministic, pycudnn.config.allow_tf32,
             pycudnn.config.deterministic)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    pycudnn.config.allow_tf32, pycudnn.config.deterministic = False, True
    try:
        base = make_model(dtype=torch.float32)
        data = make_data(args.loss_batch, 4, dtype=torch.float32)
        sides = {"torch": copy.deepcopy(base), "pycudnn": pycudnn_side(copy.deepcopy(base))}
        del base
        import pycudnn.torch as pt

        routed = sum(isinstance(m, pt.Conv2d) for m in sides["pycudnn"].modules())
        assert routed == 53, f"{routed} convolutions routed through pycudnn.torch, expected 53"
        losses = {}
        for name, model in sides.items():
            opt = sgd(model)
            losses[name] = [float(train_step(model, opt, *data[i % len(data)]).detach())
                            for i in range(args.curve)]
    finally:
        (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
         torch.backends.cudnn.deterministic, pycudnn.config.allow_tf32,
         pycudnn.config.deterministic) = saved
    rel = [abs(a - b) / abs(b) for a, b in zip(losses["pycudnn"], losses["torch"])]
    print(f"loss   float32, TF32 off, deterministic, batch {args.loss_batch}")
    print("loss   step   torch       pycudnn     relative difference")
    for i, (a, b, r) in enumerate(zip(losses["torch"], losses["pycudnn"], rel)):
        print(f"       {i:4d}  {a:10.6f}  {b:10.6f}  {r:.1e}")
    print(f"loss   largest relative difference over {len(rel)} steps: {max(rel):.2e}", flush=True)
    return {"batch": args.loss_batch, "dtype": "float32", "tf32": False, "deterministic": True,
            "losses": losses, "relative_difference": rel, "loss_max_rel_diff": max(rel)}


def part_graph(args) -> dict:
    base = make_model()
    data = make_data(args.batch, 4)
    result: dict = {"batch": args.batch}
    for name in ("torch", "pycudnn"):
        model = copy.deepcopy(base)
        if name == "pycudnn":
            model = pycudnn_side(model)
        opt = sgd(model)
        static_x, static_y = data[0][0].clone(), data[0][1].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: searches, prepared calls, optimizer state
            for i in range(3):
                train_step(model, opt, static_x, static_y)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = F.cross_entropy(model(static_x), static_y)
            static_loss.backward()
            opt.step()
        graph.replay()
        torch.cuda.synchronize()
        per_step = timed(graph.replay, args.steps, args.repeats)
        result[name] = {"steps_per_s": 1.0 / per_step, "ms_per_step": per_step * 1e3,
                        "loss_after_replays": float(static_loss)}
        print(f"graph  {name:8} {1.0 / per_step:7.2f} steps/s ({per_step * 1e3:.2f} ms/step)",
              flush=True)
        del graph, model, opt
        torch.cuda.empty_cache()
    result["pycudnn_over_torch"] = result["pycudnn"]["steps_per_s"] / result["torch"]["steps_per_s"]
    print(f"graph  pycudnn / torch: {result['pycudnn_over_torch']:.3f}x", flush=True)
    return result


def first_step_child(side: str, batch: int) -> None:
    """One fresh process: build, run the first training step and the second, print JSON."""
    t0 = time.perf_counter()
    torch.backends.cudnn.benchmark = True
    model = make_model()
    if side == "pycudnn":
        model = pycudnn_side(model)
    opt = sgd(model)
    x, y = make_data(batch, 1)[0]
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    train_step(model, opt, x, y)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    train_step(model, opt, x, y)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    print(json.dumps({"side": side, "setup_s": t1 - t0, "first_step_s": t2 - t1,
                      "second_step_s": t3 - t2}))


def part_first_step(args) -> dict:
    result: dict = {"batch": args.batch}
    for side in ("torch", "pycudnn"):
        with tempfile.TemporaryDirectory(prefix="pycudnn-first-step-") as cache:
            env = dict(os.environ, PYCUDNN_CACHE_DIR=cache)
            proc = subprocess.run([sys.executable, __file__, "--first-step-child", side,
                                   "--batch", str(args.batch)], capture_output=True, text=True,
                                  env=env, timeout=900)
        if proc.returncode:
            raise RuntimeError(f"first step ({side}) failed:\n{proc.stdout}\n{proc.stderr}")
        result[side] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = result[side]
        print(f"first  {side:8} first step {r['first_step_s']:.2f} s, second {r['second_step_s']:.3f} s "
              f"(empty tuning database; process set-up {r['setup_s']:.1f} s)", flush=True)
    return result


def part_infer(args) -> dict:
    import pycudnn
    import pycudnn.torch as pt

    torch.backends.cudnn.benchmark = True
    pycudnn.config.benchmark = True
    model = make_model().eval()
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(args.infer_batch, 3, 224, 224, device="cuda", generator=g).to(DTYPE,
                                                                                memory_format=CL)
    result: dict = {"batch": args.infer_batch}
    fused = pt.fuse_for_inference(model)  # outside inference_mode: its folded weights are Parameters
    with torch.inference_mode():
        t0 = time.perf_counter()
        out_fused = fused(x)
        torch.cuda.synchronize()
        result["pycudnn_first_call_s"] = time.perf_counter() - t0
        out_eager = model(x)
        result["max_rel_diff_fused_vs_eager"] = float(
            (out_fused.float() - out_eager.float()).abs().max() / out_eager.float().abs().max())
        runs = {"torch eager": lambda: model(x), "pycudnn fused": lambda: fused(x)}
        if not args.no_compile:
            print("infer  torch.compile: compiling (this takes about a minute)...", flush=True)
            try:
                compiled = torch.compile(model)
                t0 = time.perf_counter()
                compiled(x)
                torch.cuda.synchronize()
                result["compile_s"] = time.perf_counter() - t0
                runs["torch.compile"] = lambda: compiled(x)
            except Exception as exc:  # noqa: BLE001
                result["compile_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                print(f"infer  torch.compile failed: {result['compile_error']}")
        for name, fn in runs.items():
            for _ in range(3):
                fn()
            per = timed(fn, args.infer_steps, args.repeats)
            result[name] = {"img_per_s": args.infer_batch / per, "ms_per_batch": per * 1e3}
            print(f"infer  {name:14} {args.infer_batch / per:9.0f} img/s ({per * 1e3:.2f} ms/batch)",
                  flush=True)
    base = result["pycudnn fused"]["img_per_s"]
    result["fused_over_eager"] = base / result["torch eager"]["img_per_s"]
    if "torch.compile" in result:
        result["fused_over_compile"] = base / result["torch.compile"]["img_per_s"]
    print(f"infer  fused / eager {result['fused_over_eager']:.2f}x"
          + (f", fused / compile {result['fused_over_compile']:.2f}x"
             if "fused_over_compile" in result else "")
          + f"; outputs differ by {result['max_rel_diff_fused_vs_eager']:.1e} (relative to max); "
          f"pycudnn's first call {result['pycudnn_first_call_s']:.1f} s", flush=True)
    return result


def part_host(args) -> dict:
    """Host microseconds per call, back to back on a tiny convolution (1x8x8x8, 8 3x3 filters):
    the GPU finishes each kernel long before the next call is issued."""
    import pycudnn.torch as pt

    torch.backends.cudnn.benchmark = True
    x = torch.randn(1, 8, 8, 8, device="cuda", dtype=DTYPE).to(memory_format=CL)
    w = torch.randn(8, 8, 3, 3, device="cuda", dtype=DTYPE).to(memory_format=CL)
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    g = torch.ones(1, 8, 8, 8, device="cuda", dtype=DTYPE).to(memory_format=CL)
    cases = {
        "forward, no grad": (lambda: F.conv2d(x, w, padding=1),
                             lambda: pt.conv2d(x, w, padding=1)),
        "forward + backward": (lambda: F.conv2d(xg, wg, padding=1).backward(g),
                               lambda: pt.conv2d(xg, wg, padding=1).backward(g)),
    }
    n = 500 if args.quick else 2000
    result: dict = {}
    for name, (ref, ours) in cases.items():
        row = {}
        for side, fn in (("torch", ref), ("pycudnn", ours)):
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            samples = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                samples.append((time.perf_counter() - t0) / n * 1e6)
                torch.cuda.synchronize()
            row[side] = statistics.median(samples)
        result[name] = row
        print(f"host   {name:20} torch {row['torch']:6.1f} us   pycudnn.torch {row['pycudnn']:6.1f} us "
              f"per call", flush=True)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for part in ("train", "loss", "graph", "first-step", "infer", "host"):
        ap.add_argument(f"--{part}", action="store_true", help=f"run the {part} part")
    ap.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile in --infer")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--infer-batch", type=int, default=128)
    ap.add_argument("--loss-batch", type=int, default=32, help="batch of the --loss part")
    ap.add_argument("--first-step-child", choices=("torch", "pycudnn"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("resnet50.py needs a CUDA build of PyTorch and an NVIDIA GPU")
    if args.first_step_child:
        first_step_child(args.first_step_child, args.batch)
        return 0
    args.steps, args.repeats = (10, 3) if args.quick else (30, 5)
    args.infer_steps = 10 if args.quick else 30
    args.curve = 20
    torch.backends.cudnn.benchmark = True
    parts = {"train": part_train, "loss": part_loss, "graph": part_graph, "first_step": part_first_step,
             "infer": part_infer, "host": part_host}
    chosen = [p for p in parts if getattr(args, p)] or list(parts)
    import pycudnn

    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                     "torch_cudnn": torch.backends.cudnn.version(), "cudnn": pycudnn.cudnn_version(),
                     "quick": args.quick}
    print(f"{results['device']}, torch {results['torch']} (its cuDNN {results['torch_cudnn']}), "
          f"pycudnn's cuDNN {results['cudnn']}", flush=True)
    for p in chosen:
        t0 = time.perf_counter()
        results[p] = parts[p](args)
        results[p]["part_s"] = time.perf_counter() - t0
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
