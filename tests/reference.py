"""Independent float64 NumPy references for convolutions (no cuDNN anywhere near them)."""

from __future__ import annotations

import itertools

import numpy as np


def _windows(out_sp, kidx, stride, dilation):
    return tuple(slice(k * d, k * d + s * (o - 1) + 1, s)
                 for o, k, s, d in zip(out_sp, kidx, stride, dilation))


def out_shape(in_sp, kern, stride, padding, dilation):
    return [(i + 2 * p - d * (k - 1) - 1) // s + 1
            for i, k, s, p, d in zip(in_sp, kern, stride, padding, dilation)]


def conv_forward(x, w, stride, padding, dilation, groups):
    """y[n,k] = sum_c,r x[n,c, o*s + r*d - p] * w[k,c,r] (cross-correlation, PyTorch's conv)."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    nd = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    n, c = x.shape[:2]
    k = w.shape[0]
    kern = w.shape[2:]
    out_sp = out_shape(x.shape[2:], kern, stride, padding, dilation)
    y = np.zeros((n, k, *out_sp))
    cg, kg = c // groups, k // groups
    for g in range(groups):
        xg = xp[:, g * cg:(g + 1) * cg]
        wg = w[g * kg:(g + 1) * kg]
        for kidx in itertools.product(*[range(s) for s in kern]):
            patch = xg[(slice(None), slice(None)) + _windows(out_sp, kidx, stride, dilation)]
            y[:, g * kg:(g + 1) * kg] += np.einsum("nc...,kc->nk...", patch, wg[(Ellipsis,) + kidx])
    return y


def conv_backward_data(dy, w, input_shape, stride, padding, dilation, groups):
    """The adjoint of conv_forward with respect to x."""
    dy = np.asarray(dy, np.float64)
    w = np.asarray(w, np.float64)
    n, c = input_shape[:2]
    k = w.shape[0]
    kern = w.shape[2:]
    padded = [i + 2 * p for i, p in zip(input_shape[2:], padding)]
    dxp = np.zeros((n, c, *padded))
    out_sp = dy.shape[2:]
    cg, kg = c // groups, k // groups
    for g in range(groups):
        wg = w[g * kg:(g + 1) * kg]
        dyg = dy[:, g * kg:(g + 1) * kg]
        for kidx in itertools.product(*[range(s) for s in kern]):
            sl = (slice(None), slice(g * cg, (g + 1) * cg)) + _windows(out_sp, kidx, stride, dilation)
            dxp[sl] += np.einsum("nk...,kc->nc...", dyg, wg[(Ellipsis,) + kidx])
    crop = (slice(None), slice(None)) + tuple(slice(p, p + i) for p, i in zip(padding, input_shape[2:]))
    return dxp[crop]


def conv_backward_filter(x, dy, weight_shape, stride, padding, dilation, groups):
    """Gradient of conv_forward with respect to w."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    k, cg = weight_shape[:2]
    kern = weight_shape[2:]
    kg = k // groups
    dw = np.zeros(weight_shape)
    out_sp = dy.shape[2:]
    for g in range(groups):
        xg = xp[:, g * cg:(g + 1) * cg]
        dyg = dy[:, g * kg:(g + 1) * kg]
        for kidx in itertools.product(*[range(s) for s in kern]):
            patch = xg[(slice(None), slice(None)) + _windows(out_sp, kidx, stride, dilation)]
            sp = patch.reshape(patch.shape[0], patch.shape[1], -1)
            dw[(slice(g * kg, (g + 1) * kg), slice(None)) + kidx] = np.einsum(
                "ncs,nks->kc", sp, dyg.reshape(dyg.shape[0], dyg.shape[1], -1))
    return dw


def conv_transpose(x, w, stride, padding, output_padding, dilation, groups):
    """PyTorch's conv_transpose: w is (C_in, C_out/groups, *k)."""
    n, c_in = x.shape[:2]
    c_out = w.shape[1] * groups
    sp = [(i - 1) * s - 2 * p + d * (k - 1) + op + 1
          for i, k, s, p, d, op in zip(x.shape[2:], w.shape[2:], stride, padding, dilation, output_padding)]
    return conv_backward_data(x, w, (n, c_out, *sp), stride, padding, dilation, groups)
