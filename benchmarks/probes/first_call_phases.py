"""Probe (not a benchmark): where a fresh process's first convolution goes, pycudnn's phases
against the frontend's, by wall clock (``perf_counter`` around each phase, no cProfile).

``vs_frontend.py``'s breakdown profiles pycudnn alone, and cProfile inflates its Python. This
runs ``vs_frontend.py``'s first-result layer (bf16 NHWC 3x3, batch 32, 64 channels at 56x56) in
fresh processes (torch imported, CUDA context up), the sides rotated each round, and times:

* pycudnn (one side per ``--roots`` entry: a folder to import pycudnn from, e.g. two installed
  wheels): its import; importing the modules the wrappers patch (before the call, so their
  import is counted here and not in the call); then the first call with these inclusive
  phases:
  libcudnn loaded, handle created, operation graph built, heuristics queried, configs
  described, plans finalized, plans executed, the search (``try_all``).
* the frontend (heuristics mode A): its import, handle, graph described and validated,
  ``build_operation_graph``, ``create_execution_plans``, ``check_support``, ``build_plans``,
  the workspace and ``execute``.

Each phase's median over ``--processes`` processes, ms. Run:

    PYTHONPATH=. python3 benchmarks/probes/first_call_phases.py --processes 5
    python3 benchmarks/probes/first_call_phases.py --roots /tmp/site_old,/tmp/site
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE = (32, 64, 56, 64)  # vs_frontend.FIRST_SHAPES[0]: N, C, H(=W), K


def _child(side: str) -> dict[str, Any]:
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    n, c, h, k = SHAPE
    cl = torch.channels_last
    x = torch.randn(n, c, h, h, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
    w = (torch.randn(k, c, 3, 3, device="cuda", dtype=torch.bfloat16) * 0.05).contiguous(memory_format=cl)
    y = torch.empty(n, k, h, h, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    phases: dict[str, float] = {}

    def clock(label: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            phases[label] = phases.get(label, 0.0) + (time.perf_counter() - t0) * 1e3

    if side == "pycudnn":
        pycudnn = clock("import", lambda: __import__("pycudnn"))

        def patch_all() -> None:
            pycudnn.convolution  # the name the call reaches first
            from pycudnn.cudnn.graph import plan
            from pycudnn.engines import graph as engines_graph
            from pycudnn.ffi import library
            from pycudnn.runtime import handle
            from pycudnn.api import call

            def wrap(owner: Any, name: str, label: str) -> None:
                real = getattr(owner, name)

                def timed(*a: Any, **kw: Any) -> Any:
                    return clock(label, lambda: real(*a, **kw))
                setattr(owner, name, timed)
            wrap(library, "_load", "libcudnn loaded")
            wrap(handle, "_create", "handle created")
            wrap(engines_graph, "build_convolution_graph", "operation graph built")
            wrap(plan.LazyCandidates, "_query", "heuristics queried")
            wrap(plan, "_describe", "configs described")
            wrap(plan.ExecutionPlan, "finalize", "plans finalized")
            wrap(plan.ExecutionPlan, "execute", "plans executed")
            wrap(call, "try_all", "the search (try_all)")
        clock("modules imported for the wrappers", patch_all)
        t0 = time.perf_counter()
        pycudnn.convolution(x, w, padding=1, stream=stream)
        torch.cuda.synchronize()
        phases["first call"] = (time.perf_counter() - t0) * 1e3
        return phases
    sys.path.insert(0, os.path.dirname(HERE))
    import vs_frontend  # benchmarks/: the benchmark's own graph of this layer (imported untimed)

    cudnn = clock("import", lambda: __import__("cudnn"))
    t0 = time.perf_counter()
    handle = clock("handle created", cudnn.create_handle)
    if stream.cuda_stream:
        cudnn.set_stream(handle, stream.cuda_stream)
    tensors = {"x": x, "w": w, "y": y}
    g, gt = clock("graph described and validated",
                  lambda: vs_frontend.frontend_described(cudnn, torch, handle, tensors, torch.bfloat16))
    pack = {gt[r]: tensors[r] for r in gt}
    clock("build_operation_graph", g.build_operation_graph)
    clock("create_execution_plans (heuristics)", lambda: g.create_execution_plans([cudnn.heur_mode.A]))
    clock("check_support", g.check_support)
    clock("build_plans", g.build_plans)
    ws = clock("workspace", lambda: torch.empty(max(1, g.get_workspace_size()), device="cuda",
                                                dtype=torch.uint8))
    clock("execute and synchronize", lambda: (g.execute(pack, ws, handle=handle),
                                              torch.cuda.synchronize()))
    phases["first call"] = (time.perf_counter() - t0) * 1e3
    return phases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=5)
    ap.add_argument("--roots", default="", help="folders to import pycudnn from, comma-separated "
                                                "(default: this process's pycudnn)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        with open(args.child_out, "w") as f:
            json.dump(_child(json.loads(args.child)), f)
        return 0
    sys.path.insert(0, os.path.dirname(HERE))
    import vs_frontend

    libdir = vs_frontend.libcudnn_dir()
    roots = [r for r in args.roots.split(",") if r] or [None]
    sides = [("pycudnn", r) for r in roots] + [("frontend", None)]
    got: dict[str, list[dict[str, Any]]] = {}
    for p in range(args.processes):
        for side, root in sides[p % len(sides):] + sides[:p % len(sides)]:
            label = side if root is None else f"{side} from {root}"
            got.setdefault(label, []).append(vs_frontend.run_child(side, libdir, __file__, root))
    for label, runs in got.items():
        ok = [r for r in runs if "error" not in r]
        print(f"\n## {label}: {len(ok)} of {len(runs)} processes"
              + "".join(f"\n  error: {r['error']}" for r in runs if "error" in r))
        for phase in (ok[0] if ok else {}):
            vals = sorted(r.get(phase, 0.0) for r in ok)
            print(f"  {phase:42} median {statistics.median(vals):7.1f} ms  "
                  f"(range {vals[0]:.1f}-{vals[-1]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
