"""A ``torch.autograd.Function`` whose forward and backward convolutions run in pycudnn.

Needs: an NVIDIA GPU and a CUDA build of PyTorch for the same CUDA major as pycudnn's extra
(PyTorch's install selector gives the command; `pycudnn info` warns when the two disagree).
Run:  python examples/torch_autograd.py

* Zero-copy both ways: ``pycudnn.as_tensor(torch_tensor)`` views PyTorch's memory and
  ``torch.from_dlpack(pycudnn_tensor)`` views pycudnn's; gradients are written straight into
  tensors PyTorch allocated (``out=``).
* On PyTorch's current stream: every call passes ``stream=torch.cuda.current_stream(device)``, so
  the work is ordered with PyTorch's own kernels, on side streams too (checked below).

Checks: ``torch.autograd.gradcheck`` in float64; output and gradients equal to
``torch.nn.Conv2d``'s in float32 (PyTorch's reference with cuDNN disabled, pycudnn without TF32);
the same results when run under ``torch.cuda.stream(side_stream)``.
"""

from __future__ import annotations

import sys

try:
    import torch
except ImportError:
    sys.exit("torch_autograd.py needs PyTorch, which is not installed: install a CUDA build of "
             "PyTorch for the same CUDA major as pycudnn's extra (see docs/examples.md)")

import pycudnn


class PycudnnConv2d(torch.autograd.Function):
    """``y = conv2d(x, weight) + bias`` with pycudnn doing the convolutions."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups, flags):
        stream = torch.cuda.current_stream(x.device)
        xt, wt = pycudnn.as_tensor(x), pycudnn.as_tensor(weight)  # views, no copy
        assert xt.ptr == x.data_ptr() and wt.ptr == weight.data_ptr()
        bt = None if bias is None else pycudnn.as_tensor(bias)
        y = pycudnn.convolution(xt, wt, bt, stride=stride, padding=padding, dilation=dilation,
                                groups=groups, stream=stream, **flags)
        out = torch.from_dlpack(y)  # PyTorch now owns a view of pycudnn's output memory
        assert out.data_ptr() == y.ptr
        ctx.save_for_backward(x, weight, bias)
        ctx.conf = (stride, padding, dilation, groups, flags)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, bias = ctx.saved_tensors
        stride, padding, dilation, groups, flags = ctx.conf
        stream = torch.cuda.current_stream(grad_out.device)  # autograd runs us on forward's stream
        g = grad_out.contiguous()  # autograd may hand over an expanded (stride-0) gradient
        kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, stream=stream,
                  **flags)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.empty_like(x, memory_format=torch.contiguous_format)
            pycudnn.convolution_backward_data(g, weight, tuple(x.shape), out=grad_x, **kw)
        if ctx.needs_input_grad[1]:
            grad_w = torch.empty_like(weight, memory_format=torch.contiguous_format)
            pycudnn.convolution_backward_filter(x, g, tuple(weight.shape), out=grad_w, **kw)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_b = g.sum(dim=(0, 2, 3))
        return grad_x, grad_w, grad_b, None, None, None, None, None


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, **flags):
    """Like ``torch.nn.functional.conv2d``; ``flags`` go to pycudnn (``allow_tf32=False`` ...)."""
    return PycudnnConv2d.apply(x, weight, bias, stride, padding, dilation, groups, flags)


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def main() -> int:
    if not torch.cuda.is_available():
        print("torch_autograd.py needs a CUDA build of PyTorch and an NVIDIA GPU; PyTorch sees no "
              "CUDA device here", file=sys.stderr)
        return 1
    dev = torch.device("cuda", 0)
    geometry = dict(stride=(2, 1), padding=(1, 1), dilation=(1, 2), groups=2)
    ok = True

    # 1. gradcheck in float64 (nondet_tol: backward-filter algorithms may sum in any order)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(2, 4, 7, 6, device=dev, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(6, 2, 3, 3, device=dev, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(6, device=dev, dtype=torch.float64, generator=gen, requires_grad=True)
    passed = torch.autograd.gradcheck(lambda x, w, b: conv2d(x, w, b, **geometry), (x, w, b),
                                      eps=1e-6, atol=1e-5, rtol=1e-3, nondet_tol=1e-10)
    print(f"torch_autograd: gradcheck in float64 over input, weight and bias: "
          f"{'passed' if passed else 'FAILED'}")
    ok &= bool(passed)

    # 2. against torch.nn.Conv2d in float32 (PyTorch's reference without cuDNN, no TF32 either)
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
    got = run(lambda x_, w_, b_: conv2d(x_, w_, b_, allow_tf32=False, **geometry), x32)
    errors = [rel_err(g, e) for g, e in zip(got, expected)]
    close = all(e < 1e-4 for e in errors)
    print("torch_autograd: float32 vs torch.nn.Conv2d (cuDNN disabled): relative error "
          f"output {errors[0]:.1e}, grad input {errors[1]:.1e}, grad weight {errors[2]:.1e}, "
          f"grad bias {errors[3]:.1e} ({'close' if close else 'FAILED'})")
    ok &= close

    # 3. on a side stream: pycudnn follows PyTorch's current stream, forward and backward
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        assert pycudnn.current_stream("torch") == side.cuda_stream
        assert pycudnn.current_stream(x32) == side.cuda_stream
        on_side = run(lambda x_, w_, b_: conv2d(x_, w_, b_, allow_tf32=False, **geometry), x32)
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.cuda.synchronize(dev)
    side_errors = [rel_err(s, e) for s, e in zip(on_side, expected)]
    same = all(e < 1e-4 for e in side_errors)
    print(f"torch_autograd: on a side stream, max relative error {max(side_errors):.1e} "
          f"({'close' if same else 'FAILED'})")
    ok &= same

    print(f"torch_autograd: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if not pycudnn.device_count():
        sys.exit("torch_autograd.py needs an NVIDIA GPU with a working driver; none "
                 "is usable here (`pycudnn info` says why)")
    sys.exit(main())
