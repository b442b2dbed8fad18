"""Probe (not a benchmark): do the plans pycudnn's graph engine picks support cuDNN's native
CUDA-graph API (``cudnnBackendPopulateCudaGraph``, no stream capture), and how fast is a launch
of a graph populated that way?

For a tiny convolution and four ResNet-like layers (fp32 NCHW, bf16 and fp16 channels-last),
heuristics and ``benchmark=True``: the plan's tag and behaviour notes; for a plan with
``SUPPORTS_CUDA_GRAPH_NATIVE_API``, the graph populated, instantiated, launched and compared with
PyTorch, and the host time of ``cuGraphLaunch``.

Result (H200, cuDNN 9.19; `benchmarks/results/2026-12-04/replay_probes.txt`): none of the 12
plans (eng70, eng28, eng22, eng62, eng58, eng67) reports the note, so the capture-free way does
not apply to them and graph replay has to capture. Run:

    PYTHONPATH=. python3 benchmarks/probes/native_graph_notes.py
"""
import ctypes, time
import torch
import pycudnn
from pycudnn.ffi import library as L
from pycudnn.ffi.backend import BehaviorNote
from pycudnn.runtime.memory import driver as D
from pycudnn.runtime.handle import get_handle
drv = D.driver()
cd = L.lib()._cdll
pop = cd.cudnnBackendPopulateCudaGraph
pop.restype = ctypes.c_int; pop.argtypes = [ctypes.c_void_p] * 4
cases = [((1, 8, 8, 8), 8, 3, torch.float32, torch.contiguous_format),
         ((1, 8, 8, 8), 8, 3, torch.bfloat16, torch.channels_last),
         ((64, 64, 56, 56), 64, 3, torch.bfloat16, torch.channels_last),
         ((64, 256, 56, 56), 64, 1, torch.bfloat16, torch.channels_last),
         ((64, 128, 28, 28), 128, 3, torch.float32, torch.contiguous_format),
         ((32, 512, 7, 7), 512, 3, torch.float16, torch.channels_last)]
for shape, k, r, dt, fmt in cases:
    x = torch.randn(shape, device="cuda", dtype=dt).to(memory_format=fmt)
    w = torch.randn(k, shape[1], r, r, device="cuda", dtype=dt).to(memory_format=fmt)
    for bench in (False, True):
        p = pycudnn.prepare_convolution(x, w, padding=r // 2, benchmark=bench)
        plan = p.record.plan
        notes = [getattr(n, "name", n) for n in plan.behavior_notes]
        native = BehaviorNote.SUPPORTS_CUDA_GRAPH_NATIVE_API in plan.behavior_notes
        res = ""
        if native:
            y = torch.empty_like(pycudnn.convolution(x, w, padding=r // 2, benchmark=bench))
            h = get_handle(0, 0)
            ws = torch.empty(max(plan.workspace_size or 0, 1), dtype=torch.uint8, device="cuda")
            plan.execute(h, (x.data_ptr(), w.data_ptr(), y.data_ptr()), ws.data_ptr() if plan.workspace_size else 0)
            vp = plan._packs[next(reversed(plan._packs))]
            g = ctypes.c_void_p()
            cg = ctypes.CDLL("libcuda.so.1").cuGraphCreate
            cg.restype = ctypes.c_int; cg.argtypes = [ctypes.c_void_p, ctypes.c_uint]
            assert cg(ctypes.byref(g), 0) == 0
            t0 = time.perf_counter(); st = pop(h, plan._plan_ptr, vp._ptr, g); t1 = time.perf_counter()
            ex = ctypes.c_void_p()
            e = drv.cuGraphInstantiateWithFlags(ctypes.byref(ex), g, 0); t2 = time.perf_counter()
            ref = torch.nn.functional.conv2d(x.float(), w.float(), padding=r // 2)
            y.zero_(); torch.cuda.synchronize()
            e2 = drv.cuGraphLaunch(ex, 0); torch.cuda.synchronize()
            err = float((y.float() - ref).abs().max() / ref.abs().max())
            n = 2000; t3 = time.perf_counter()
            for _ in range(n): drv.cuGraphLaunch(ex, 0)
            t4 = time.perf_counter(); torch.cuda.synchronize()
            res = f"populate st={st} {1e3*(t1-t0):.2f} ms inst={e} {1e3*(t2-t1):.2f} ms launch={e2} err={err:.1e} launch {1e6*(t4-t3)/n:.2f} us"
        print(shape, k, r, dt, "bench" if bench else "heur", plan.tag, notes, res, flush=True)
