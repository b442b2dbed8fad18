"""Probe (not a benchmark): which data types of the batch-norm fusion graphs get an engine on
this GPU and cuDNN. For bf16 and fp16, 1x1 and 3x3, each combination of `FusionDtypes` (the
prologue's scale and bias, what the convolution reads, the statistics' precision) for
`conv_genstats` with and without the prologue and for `sbr_wgrad`, `bn_finalize` writing the
equivalent scale and bias in the input's type, and the virtual tensors' type of
`dgrad_drelu_dbn`: how many engine configs heuristics modes A+FALLBACK and B give,
their problems, and the first plan that finalizes or why none did. Decides the order of
`PROLOGUE_DTYPES`. Run:

    PYTHONPATH=. python3 benchmarks/probes/bn_fusion_dtypes.py   # writes $OUT/bn_fusion_dtypes.json
"""

from __future__ import annotations

import itertools
import json
import os

import torch

from pycudnn.cudnn import graph as G
from pycudnn.cudnn.graph import batchnorm as BN
from pycudnn.errors import NoAlgorithmError
from pycudnn.runtime.handle import get_handle
from pycudnn.torch.calls import DTYPE_NAMES

N, C, K, HW = 4, 32, 64, 16
ROWS: list[dict] = []


def spec(uid: int, shape: tuple[int, ...], dtype: torch.dtype) -> G.TensorSpec:
    t = torch.empty(*shape, dtype=dtype, device="cuda").contiguous(
        memory_format=torch.channels_last)
    return G.TensorSpec(uid, tuple(t.shape), tuple(t.stride()), DTYPE_NAMES[dtype])


def attempt(handle: int, case: str, build) -> None:
    row: dict = {"case": case}
    try:
        graph = build()
    except Exception as exc:  # noqa: BLE001 - a probe reports and carries on
        row["build_error"] = f"{type(exc).__name__}: {exc}"[:300]
    else:
        for modes in (("A", "FALLBACK"), ("B",)):
            cands = G.engine_configs(handle, graph, modes)
            got: dict = {"configs": len(cands),
                         "problems": [str(p)[:200] for p in getattr(cands, "problems", [])][:3]}
            if len(cands):
                try:
                    plan, _ = G.first_plan(handle, cands, max_attempts=8)
                    got["plan"] = plan.config.tag
                except NoAlgorithmError as exc:
                    got["refused"] = [str(f)[:150] for f in exc.failures[:3]]
            row["+".join(modes)] = got
    ROWS.append(row)
    print(row, flush=True)


def main() -> None:
    h = get_handle(stream=torch.cuda.current_stream().cuda_stream)
    table = [BN.FusionDtypes(*d) for d in itertools.product(("io", "float32"), repeat=3)]
    for dtype in (torch.bfloat16, torch.float16):
        io = name = DTYPE_NAMES[dtype]
        for ks in (1, 3):
            x, w = spec(1, (N, C, HW, HW), dtype), spec(2, (K, C, ks, ks), dtype)
            y = spec(3, (N, K, HW, HW), dtype)
            for stats in ("io", "float32"):
                attempt(h, f"genstats {name} {ks}x{ks} stats={stats}",
                        lambda: BN.build_conv_genstats_graph(
                            h, x, w, y, BN.channel_spec(4, K), BN.channel_spec(5, K), ks // 2, 1,
                            1, None, io if stats == "io" else "float32"))
            for d in table:
                attempt(h, f"genstats {name} {ks}x{ks} prologue {tuple(d)}",
                        lambda: BN.build_conv_genstats_graph(
                            h, x, w, y, BN.channel_spec(4, K), BN.channel_spec(5, K), ks // 2, 1,
                            1, d.prologue(io, 6, C), d.resolve(io).stats))
        x, dy = spec(1, (N, C, HW, HW), dtype), spec(2, (N, K, HW, HW), dtype)
        dw = spec(3, (K, C, 3, 3), dtype)
        for d in dict.fromkeys(d._replace(stats="float32") for d in table):
            attempt(h, f"sbr_wgrad {name} {tuple(d)[:2]}", lambda: BN.build_sbr_wgrad_graph(
                h, x, dy, dw, d.prologue(io, 4, C), 1, 1, 1))
        # the equivalent scale and bias written in the input's type: no cast before a
        # prologue that takes them so
        for eq in ("float32", io):
            attempt(h, f"bn_finalize eq_scale/eq_bias {eq}", lambda: BN.build_bn_finalize_graph(
                h, *[BN.channel_spec(i, C) for i in range(1, 9)],
                BN.channel_spec(9, C, dtype=eq), BN.channel_spec(10, C, dtype=eq),
                count=N * HW * HW, eps=1e-5, momentum=0.1))
        w = spec(2, (K, C, 3, 3), dtype)
        for virtual in ("float32", io):
            original = BN._Assembler.virtual

            def typed(self, like, dtype=virtual, _o=original):
                return _o(self, like, dtype)

            BN._Assembler.virtual = typed  # every virtual tensor of the graph in this type
            try:
                attempt(h, f"dgrad_drelu_dbn {name} virtual={virtual}",
                        lambda: BN.build_dgrad_drelu_dbn_graph(
                            h, spec(1, (N, K, HW, HW), dtype), w, spec(3, (N, C, HW, HW), dtype),
                            spec(4, (N, C, HW, HW), dtype),
                            *[BN.channel_spec(i, C) for i in range(5, 14)], padding=1))
            finally:
                BN._Assembler.virtual = original
    path = os.path.join(os.environ.get("OUT", "/tmp"), "bn_fusion_dtypes.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "cudnn": torch.backends.cudnn.version(),
                   "rows": ROWS}, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
