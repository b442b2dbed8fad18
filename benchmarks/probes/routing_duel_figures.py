"""Probe (not a benchmark): each routing duel's own timed runs beside the decision it recorded.

A fused ResNet-50 (bf16 channels_last, batch 128, eval) in benchmark mode; ``routing.time_call`` and
``routing.pycudnn_wins`` wrapped to log every timing (the lambda's line in ``calls.py`` says
which side: pycudnn's launch or PyTorch's operations; GPU us, back-to-back us). Then one layer's
duel again on a copy of its input, and PyTorch's side timed directly. At 6206691 this showed
the duel's recorded PyTorch figure taken from pycudnn's run (fixed in f3f10bd).

    PYTHONPATH=. python3 benchmarks/probes/routing_duel_figures.py
"""
import torch
import torchvision

import pycudnn.torch as pt
from pycudnn.torch import calls, routing
from pycudnn.tuning import routes as route_store
torch.backends.cudnn.benchmark = True
torch.manual_seed(0)
m = torchvision.models.resnet50(weights=None).cuda().to(torch.bfloat16, memory_format=torch.channels_last).eval()
x = torch.randn(128, 3, 224, 224, device="cuda").to(torch.bfloat16, memory_format=torch.channels_last)
real_time = routing.time_call
log = []
def logged(fn, device, stream):
    r = real_time(fn, device, stream)
    log.append((getattr(fn, "__qualname__", "?"), fn.__code__.co_firstlineno if hasattr(fn, "__code__") else 0, round(r[0], 1), round(r[1], 1)))
    return r
routing.time_call = logged
real_wins = routing.pycudnn_wins
def wins(signature, direction, ours, theirs, device, stream, flags=None):
    log.append(("DUEL", signature[:60], ours.__code__.co_firstlineno, theirs.__code__.co_firstlineno))
    return real_wins(signature, direction, ours, theirs, device, stream, flags)
routing.pycudnn_wins = wins
with torch.no_grad():
    f = pt.fuse_for_inference(m)
    f(x); torch.cuda.synchronize()
for l in log[:14]: print(l)
mm = [q for q in f.modules() if type(q).__name__ == "FusedConv2d" and q.relu and not q.residual][3]
feats = {}
h = mm.register_forward_pre_hook(lambda mod, a: feats.setdefault("x", a[0].clone()))
with torch.no_grad():
    f(x)
h.remove()
xi = feats["x"]; w, b = mm.weight, mm.bias; geom = mm._geometry[0]
print("isolated duel on the clone:")
pt.clear_cache(); routing.clear_report(); route_store.clear(); log.clear()
with torch.no_grad():
    pt.conv2d_bias_relu(xi, w, b, *geom)
for l in log: print(l)
print([ (d["winner"], d["pycudnn_gpu_us"], d["torch_gpu_us"]) for d in pt.routing_report()])
print("torch_forward direct:", real_time(lambda: calls.torch_forward("bias_relu", xi, w, b, None, 1.0, geom), 0, calls.caller_stream(0)))
