"""Host cost of a fused training block against PyTorch eager and a converted model: ten
Conv-BN-ReLU at tiny shapes (host-bound), and tests/torch_models.py's SmallResNet, forward and
backward per iteration, wall time; then a cProfile of the fused side.

    PYTHONPATH=. python3 benchmarks/probes/fused_block_host.py
"""
import copy, time, cProfile, pstats, io, sys
import torch, torch.nn as nn
import pycudnn.torch as pt
sys.path.insert(0, "tests")
from torch_models import SmallResNet
torch.backends.cudnn.benchmark = True
CL = torch.channels_last
dev = "cuda"
def chain():
    return nn.Sequential(*[nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()) for _ in range(10)])
for name, mk, shape in (("chain10", chain, (2, 16, 8, 8)), ("smallresnet", SmallResNet, (2, 3, 16, 16))):
    base = mk().to(dev, torch.bfloat16, memory_format=CL)
    sides = {"torch": copy.deepcopy(base), "convert": pt.convert(copy.deepcopy(base)),
             "fused": pt.fuse_for_training(pt.convert(copy.deepcopy(base)))}
    x = torch.randn(shape, device=dev, dtype=torch.bfloat16).to(memory_format=CL)
    def it(m):
        y = m(x); y.float().sum().backward()
    for k, m in sides.items():
        for _ in range(20): it(m)
    torch.cuda.synchronize()
    res = {}
    for r in range(3):
        for k, m in sides.items():
            t = time.perf_counter()
            for _ in range(200): it(m)
            torch.cuda.synchronize()
            res.setdefault(k, []).append((time.perf_counter() - t) / 200 * 1e6)
    print(name, {k: round(min(v), 1) for k, v in res.items()}, "us per fwd+bwd", flush=True)
    if name == "chain10":
        pr = cProfile.Profile(); pr.enable()
        for _ in range(100): it(sides["fused"])
        torch.cuda.synchronize(); pr.disable()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[:6000])
