"""Where a fused training block's host time goes: a chain of ten Conv-BN-ReLU at tiny shapes
(host-bound) as PyTorch eager, converted and fused, forward + backward per iteration; then the
pieces one by one (PyTorch's operators, the fused block's cuDNN calls, a Python autograd
function against a C++ operator), a cProfile of the fused and converted sides and a
torch.profiler table per side.

    PYTHONPATH=. python3 benchmarks/probes/fused_block_pieces.py
"""
import copy, time, cProfile, pstats, io, sys, os
import torch, torch.nn as nn
import pycudnn.torch as pt
from pycudnn.torch import training as T, calls as C
from pycudnn.runtime.handle import get_handle
torch.backends.cudnn.benchmark = True
CL = torch.channels_last
OUT = os.environ.get("OUT", "/tmp")
def chain():
    return nn.Sequential(*[nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()) for _ in range(10)])
base = chain().to("cuda", torch.bfloat16, memory_format=CL)
sides = {"torch": copy.deepcopy(base), "convert": pt.convert(copy.deepcopy(base)),
         "fused": pt.fuse_for_training(pt.convert(copy.deepcopy(base)))}
x = torch.randn((2, 16, 8, 8), device="cuda", dtype=torch.bfloat16).to(memory_format=CL)
def it(m):
    y = m(x); y.float().sum().backward()
for k, m in sides.items():
    for _ in range(20): it(m)
torch.cuda.synchronize()
def tb(fn, n=200):
    best = 1e9
    for r in range(3):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(n): fn()
        torch.cuda.synchronize(); best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best
print("fwd+bwd us/iter", {k: round(tb(lambda m=m: it(m)), 1) for k, m in sides.items()})
print("fwd only us/iter", {k: round(tb(lambda m=m: m(x)), 1) for k, m in sides.items()})
with torch.no_grad():
    print("fwd no_grad us/iter", {k: round(tb(lambda m=m: m(x)), 1) for k, m in sides.items()})
# pieces of the fused forward
blk = [m for m in sides["fused"].modules() if isinstance(m, T.ConvBnReLU2d)][0]
c = blk.conv(x) if False else torch.empty_like(x)
e = T._layout(c, blk.ops)
d = 0
s = T._stream(d)
geom = blk.geometry[0]
w = blk.conv.weight
pieces = {
 "stream": lambda: T._stream(d),
 "get_handle": lambda: get_handle(d, T._stream(d)),
 "layout": lambda: T._layout(c, blk.ops),
 "empty_like": lambda: torch.empty_like(c),
 "geometry": lambda: blk.geometry,
 "run_forward(conv)": lambda: C.run_forward("conv", x, w, None, None, 1.0, geom),
 "F.conv2d": lambda: torch.nn.functional.conv2d(x, w, None, *geom),
 "pytorch_only": C.pytorch_only,
 "autocast_enabled": C.autocast_enabled,
 "nbt.add_": lambda: blk.bn.num_batches_tracked.add_(1),
}
bn = blk.bn
y = torch.empty_like(c); stats = torch.empty(32, device="cuda"); reserve = torch.empty(e.reserve, dtype=torch.uint8, device="cuda") if e.reserve else None
ws = T._scratch(e.fwd_ws, c.device)
h = get_handle(d, s)
def raw_fwd():
    e.forward(h, 2, e.ops, e.one, e.zero, e.xd, c.data_ptr(), e.xd, None, e.xd, y.data_ptr(), e.pd, bn.weight.data_ptr(), bn.bias.data_ptr(), 0.1, bn.running_mean.data_ptr(), bn.running_var.data_ptr(), bn.eps, stats.data_ptr(), stats.data_ptr() + 64, e.act, ws, e.fwd_ws, None if reserve is None else reserve.data_ptr(), e.reserve)
pieces["cudnnBNFwdEx raw"] = raw_fwd
dc = torch.empty_like(c); dg = torch.empty(16, device="cuda"); db = torch.empty(16, device="cuda"); gy = torch.randn_like(c)
bws = T._scratch(e.bwd_ws, c.device)
def raw_bwd():
    e.backward(h, 2, e.ops, e.one, e.zero, e.one, e.zero, e.xd, c.data_ptr(), e.xd, y.data_ptr(), e.xd, gy.data_ptr(), e.xd, None, e.xd, dc.data_ptr(), e.pd, bn.weight.data_ptr(), bn.bias.data_ptr(), dg.data_ptr(), db.data_ptr(), bn.eps, stats.data_ptr(), stats.data_ptr() + 64, e.act, bws, e.bwd_ws, None if reserve is None else reserve.data_ptr(), e.reserve)
pieces["cudnnBNBwdEx raw"] = raw_bwd
xx = x.clone()
pieces["run_backward(conv)"] = lambda: C.run_backward(gy, xx, w, torch.channels_last, geom, True, True)
cb_ = torch.ops.aten.convolution_backward.default
pieces["aten.convolution_backward"] = lambda: cb_(gy, xx, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
pieces["native_batch_norm_backward"] = lambda: torch.ops.aten.native_batch_norm_backward(gy, c, bn.weight, bn.running_mean, bn.running_var, stats[:16], stats[16:], True, 1e-5, [True, True, True])
pieces["threshold_backward"] = lambda: torch.ops.aten.threshold_backward(gy, y, 0)
class Nop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, c_, d_, e_, f_, g_):
        ctx.save_for_backward(a, b, c_, d_, e_, f_, g_)
        return torch.empty_like(a)
    @staticmethod
    def backward(ctx, g):
        ctx.saved_tensors
        return g, None, None, None, None, None, None
nopin = [torch.randn(4, device="cuda", requires_grad=True) for _ in range(7)]
def nop_fb():
    Nop.apply(*nopin).backward(torch.ones(4, device="cuda"))
def torch_fb():
    (nopin[0] * 2).backward(torch.ones(4, device="cuda"))
pieces["PyFunction fwd+bwd (7 in)"] = nop_fb
pieces["aten mul fwd+bwd"] = torch_fb
pieces["F.batch_norm train"] = lambda: torch.nn.functional.batch_norm(c, bn.running_mean, bn.running_var, bn.weight, bn.bias, True, 0.1, 1e-5)
pieces["torch.relu"] = lambda: torch.relu(c)
if True:
    for k, f in pieces.items():
        f()
        print(f"  {k:24} {tb(f, 500):8.2f} us")
for k in ("fused", "convert"):
    pr = cProfile.Profile(); pr.enable()
    for _ in range(200): it(sides[k])
    torch.cuda.synchronize(); pr.disable()
    sio = io.StringIO(); pstats.Stats(pr, stream=sio).sort_stats("tottime").print_stats(30)
    print(f"==== cProfile {k} (200 iters of 10 blocks)\n", sio.getvalue()[:7000])
from torch.profiler import profile, ProfilerActivity
for k, m in sides.items():
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        it(m); torch.cuda.synchronize()
    ev = prof.key_averages()
    kern = sum(e.count for e in ev if e.device_type.name == "CUDA")
    print(f"==== profiler {k}: cuda kernels per iter {kern}")
    print(ev.table(sort_by="self_cpu_time_total", row_limit=18))
