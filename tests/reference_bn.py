"""Independent float64 NumPy references for batch normalization (no cuDNN anywhere near them)."""

from __future__ import annotations

import numpy as np


def axes(ndim: int, mode: str) -> tuple[int, ...]:
    """The axes a statistic is taken over: the batch, and the spatial dims unless per activation."""
    return (0,) if mode == "per_activation" else (0,) + tuple(range(2, ndim))


def _shape(stat: np.ndarray, x: np.ndarray, mode: str) -> np.ndarray:
    """A per-channel (or per-activation) statistic shaped to broadcast over x."""
    if mode == "per_activation":
        return stat.reshape((1,) + x.shape[1:])
    return stat.reshape((1, -1) + (1,) * (x.ndim - 2))


def forward_training(x, w, b, rm, rv, momentum, eps, mode):
    """(y, mean, invstd, new running mean, new running var) as PyTorch defines batch norm."""
    x = np.asarray(x, np.float64)
    ax = axes(x.ndim, mode)
    n = int(np.prod([x.shape[a] for a in ax]))
    mean = x.mean(axis=ax)
    var = x.var(axis=ax)  # biased: normalizes the batch
    invstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - _shape(mean, x, mode)) * _shape(invstd, x, mode)
    y = xhat * _shape(np.asarray(w, np.float64), x, mode) + _shape(np.asarray(b, np.float64), x,
                                                                   mode)
    new_rm = new_rv = None
    if rm is not None:
        new_rm = (1 - momentum) * np.asarray(rm, np.float64).reshape(mean.shape) + momentum * mean
        new_rv = ((1 - momentum) * np.asarray(rv, np.float64).reshape(var.shape)
                  + momentum * var * n / (n - 1))  # unbiased in the running value
    return y, mean, invstd, new_rm, new_rv


def forward_inference(x, w, b, rm, rv, eps, mode):
    x = np.asarray(x, np.float64)
    f = lambda v: _shape(np.asarray(v, np.float64), x, mode)  # noqa: E731
    return (x - f(rm)) / np.sqrt(f(rv) + eps) * f(w) + f(b)


def backward(x, dy, w, eps, mode):
    """(dx, dw, db) of forward_training's y with respect to x, w and b."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    ax = axes(x.ndim, mode)
    n = int(np.prod([x.shape[a] for a in ax]))
    mean = x.mean(axis=ax)
    invstd = 1.0 / np.sqrt(x.var(axis=ax) + eps)
    xhat = (x - _shape(mean, x, mode)) * _shape(invstd, x, mode)
    db = dy.sum(axis=ax)
    dw = (dy * xhat).sum(axis=ax)
    dxhat = dy * _shape(np.asarray(w, np.float64), x, mode)
    dx = _shape(invstd, x, mode) / n * (n * dxhat - _shape(dxhat.sum(axis=ax), x, mode)
                                        - xhat * _shape((dxhat * xhat).sum(axis=ax), x, mode))
    return dx, dw, db
