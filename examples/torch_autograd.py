"""PyTorch models with their convolutions in pycudnn: ``pycudnn.torch``.

Needs: an NVIDIA GPU and a CUDA build of PyTorch for the same CUDA major as pycudnn's extra
(PyTorch's install selector gives the command; `pycudnn info` warns when the two disagree).
Run:  python torch_autograd.py

* ``pycudnn.torch.conv2d`` is ``torch.nn.functional.conv2d`` as a ``torch.autograd.Function``
  whose forward, backward-data and backward-filter convolutions run in pycudnn; outputs come from
  PyTorch's caching allocator and the work runs on PyTorch's current stream.
* ``pycudnn.torch.convert(model)`` makes every ``nn.Conv2d`` of a model a
  ``pycudnn.torch.Conv2d`` (same parameters, state_dict and optimizer).

Checks: ``torch.autograd.gradcheck`` in float64; output and gradients equal to
``torch.nn.Conv2d``'s in float32 (PyTorch's reference with cuDNN disabled, TF32 off on both
sides); the same results under ``torch.cuda.stream(side_stream)``; a converted model's loss
equal to the original's.
"""

from __future__ import annotations

if __name__ == "__main__":  # before any optional import, so that --help works without it
    import argparse

    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import copy
import sys

try:
    import torch
except ImportError:
    sys.exit("torch_autograd.py needs PyTorch, which is not installed: install a CUDA build of "
             "PyTorch for the same CUDA major as pycudnn's extra (PyTorch's install selector "
             "gives the command)")

import pycudnn
import pycudnn.torch as pt


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def main() -> int:
    if not torch.cuda.is_available():
        print("torch_autograd.py needs a CUDA build of PyTorch and an NVIDIA GPU; PyTorch sees no "
              "CUDA device here", file=sys.stderr)
        return 1
    dev = torch.device("cuda", 0)
    torch.backends.cudnn.allow_tf32 = False  # pycudnn.torch follows PyTorch's flags
    geometry = dict(stride=(2, 1), padding=(1, 1), dilation=(1, 2), groups=2)
    ok = True

    # 1. gradcheck in float64 (nondet_tol: backward-filter algorithms may sum in any order)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(2, 4, 7, 6, device=dev, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(6, 2, 3, 3, device=dev, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(6, device=dev, dtype=torch.float64, generator=gen, requires_grad=True)
    passed = torch.autograd.gradcheck(lambda x, w, b: pt.conv2d(x, w, b, **geometry), (x, w, b),
                                      eps=1e-6, atol=1e-5, rtol=1e-3, nondet_tol=1e-10)
    print(f"torch_autograd: gradcheck in float64 over input, weight and bias: "
          f"{'passed' if passed else 'FAILED'}")
    ok &= bool(passed)

    # 2. against torch.nn.Conv2d in float32 (PyTorch's reference without cuDNN)
    torch.manual_seed(0)
    ref_mod = torch.nn.Conv2d(4, 6, 3, **geometry).to(dev)
    x32 = torch.randn(8, 4, 15, 12, device=dev)
    with torch.no_grad():
        gy = torch.randn_like(ref_mod(x32))

    def run(fn, x_in):
        x_in = x_in.detach().clone().requires_grad_(True)
        weight = ref_mod.weight.detach().clone().requires_grad_(True)
        bias = ref_mod.bias.detach().clone().requires_grad_(True)
        y = fn(x_in, weight, bias)
        y.backward(gy)
        return y.detach(), x_in.grad, weight.grad, bias.grad

    with torch.backends.cudnn.flags(enabled=False):
        expected = run(lambda x_, w_, b_: torch.nn.functional.conv2d(x_, w_, b_, **geometry), x32)
    got = run(lambda x_, w_, b_: pt.conv2d(x_, w_, b_, **geometry), x32)
    errors = [rel_err(g, e) for g, e in zip(got, expected)]
    close = all(e < 1e-4 for e in errors)
    print("torch_autograd: float32 vs torch.nn.Conv2d (cuDNN disabled): relative error "
          f"output {errors[0]:.1e}, grad input {errors[1]:.1e}, grad weight {errors[2]:.1e}, "
          f"grad bias {errors[3]:.1e} ({'close' if close else 'FAILED'})")
    ok &= close

    # 3. on a side stream: pycudnn.torch runs on PyTorch's current stream, forward and backward
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        assert pycudnn.current_stream("torch") == side.cuda_stream
        on_side = run(lambda x_, w_, b_: pt.conv2d(x_, w_, b_, **geometry), x32)
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.cuda.synchronize(dev)
    side_errors = [rel_err(s, e) for s, e in zip(on_side, expected)]
    same = all(e < 1e-4 for e in side_errors)
    print(f"torch_autograd: on a side stream, max relative error {max(side_errors):.1e} "
          f"({'close' if same else 'FAILED'})")
    ok &= same

    # 4. a whole model converted: same parameters, same loss
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 8, 3, stride=2), torch.nn.Flatten()).to(dev)
    converted = pt.convert(copy.deepcopy(model))
    with torch.backends.cudnn.flags(enabled=False):
        ref_loss = model(x32).square().mean()
    loss = converted(x32).square().mean()
    same_loss = abs(float(loss) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss))
    print(f"torch_autograd: converted model ({sum(type(m) is pt.Conv2d for m in converted.modules())} "
          f"pycudnn.torch.Conv2d) loss {float(loss):.6f} vs {float(ref_loss):.6f} "
          f"({'equal' if same_loss else 'FAILED'})")
    ok &= same_loss

    print(f"torch_autograd: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if not pycudnn.device_count():
        sys.exit("torch_autograd.py needs an NVIDIA GPU with a working driver; none "
                 "is usable here (`pycudnn info` says why)")
    sys.exit(main())
