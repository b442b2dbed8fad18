"""Train a small CNN on scikit-learn's digits (8x8 images, no download): pycudnn runs every layer
but the dense one, forward and backward (convolutions, batch norm, ReLU, max pooling,
log-softmax), and CuPy does the rest (the dense layer, the loss, Adam).

Needs: an NVIDIA GPU, CuPy (13 or 14) and scikit-learn; tqdm draws the progress bar when
installed:
  pip install "pycudnn-ctypes[cu12,examples-cu12] @ git+https://github.com/pycudnn/pycudnn"
  (CUDA 13: [cu13,examples-cu13]; in a clone of pycudnn: pip install ".[cu12,examples-cu12]").
Run:  python train_digits_cnn.py
It prints a progress bar per epoch (tqdm when installed), the test accuracy and the training time,
and exits with status 1 unless the accuracy is at least 95% and training took under a minute.

    input (N, 1, 8, 8)
    conv 3x3, 16 channels, padding 1    pycudnn.convolution
    batch norm, ReLU                    pycudnn.batch_norm_forward_training (when testing:
                                        batch_norm_forward_inference), pycudnn.activation_forward
    conv 3x3, 32 channels, padding 1    the same
    batch norm, ReLU
    max pool 2x2     -> (N, 32, 4, 4)   pycudnn.pooling_forward
    dense 512 -> 10                     CuPy
    log-softmax, cross-entropy          pycudnn.softmax_forward(..., algorithm="log")
The backward pass goes through the matching pycudnn functions (*_backward, convolution_backward_*).
Everything runs on CuPy's current stream, which every pycudnn call is given.
"""

from __future__ import annotations

if __name__ == "__main__":  # before any optional import, so that --help works without it
    import argparse

    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import sys
import time

import numpy as np

try:
    import cupy as cp
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
except ImportError as exc:
    sys.exit(f"train_digits_cnn.py needs CuPy and scikit-learn ({exc.name} is missing): "
             'pip install "pycudnn-ctypes[cu12,examples-cu12] @ '
             'git+https://github.com/pycudnn/pycudnn" (CUDA 13: [cu13,examples-cu13])')

import pycudnn

EPOCHS = 20
BATCH = 64
LR = 3e-3
MOMENTUM = 0.1  # the weight of each batch in batch norm's running statistics
TARGET_ACCURACY = 0.95
TIME_LIMIT_S = 60.0


# ---- a progress bar: tqdm when installed, else a plain text one ---------------------------------

class _TextBar:
    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.n, self.postfix = total, desc, 0, ""
        self.tty = sys.stdout.isatty()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.tty:
            print("\r" + self._line(), end="", flush=True)

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def _line(self) -> str:
        width = 20
        filled = width * self.n // max(self.total, 1)
        return (f"{self.desc} [{'#' * filled}{'.' * (width - filled)}] {self.n}/{self.total}"
                + (f" {self.postfix}" if self.postfix else ""))

    def close(self) -> None:
        print(("\r" if self.tty else "") + self._line(), flush=True)


def progress(total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:
        return _TextBar(total, desc)
    return tqdm(total=total, desc=desc, leave=True, ncols=90)  # on stderr, like any tqdm bar


# ---- the model ------------------------------------------------------------------------------------

def init_params(rng):
    def he(shape, fan_in):
        return rng.standard_normal(shape, dtype=cp.float32) * np.float32(np.sqrt(2.0 / fan_in))

    # the convolutions have no bias: the batch norm after each one adds its own shift (beta)
    return {
        "w1": he((16, 1, 3, 3), 9),
        "g1": cp.ones(16, cp.float32), "b1": cp.zeros(16, cp.float32),  # batch norm's gamma, beta
        "w2": he((32, 16, 3, 3), 16 * 9),
        "g2": cp.ones(32, cp.float32), "b2": cp.zeros(32, cp.float32),
        "w3": he((512, 10), 512), "b3": cp.zeros(10, cp.float32),
    }


def init_running_stats():
    """Batch norm's running mean and variance per channel: every training step updates them in
    place, testing normalizes with them."""
    return {"mean1": cp.zeros(16, cp.float32), "var1": cp.ones(16, cp.float32),
            "mean2": cp.zeros(32, cp.float32), "var2": cp.ones(32, cp.float32)}


def conv_bn_relu(x, w, gamma, beta, running_mean, running_var, stream, training):
    """conv 3x3 (padding 1) -> batch norm -> ReLU; returns the output and what backward needs.
    Every result is a pycudnn.Tensor, which the next pycudnn call takes as it is."""
    z = pycudnn.convolution(x, w, padding=1, stream=stream)
    if training:  # normalize with the batch's statistics, update the running ones in place
        bn = pycudnn.batch_norm_forward_training(z, gamma, beta, running_mean, running_var,
                                                 momentum=MOMENTUM, stream=stream)
        h = bn[0]  # bn unpacks to (y, save_mean, save_invstd); bn.reserve goes to backward too
    else:  # normalize with the running statistics
        bn = None
        h = pycudnn.batch_norm_forward_inference(z, gamma, beta, running_mean, running_var,
                                                 stream=stream)
    a = pycudnn.activation_forward(h, "relu", stream=stream)
    return a, (x, z, bn, h, a)


def conv_bn_relu_backward(da, w, gamma, cache, stream, input_grad=True):
    """Gradients of conv_bn_relu from the gradient of its output:
    (dx, or None without input_grad, dw, dgamma, dbeta)."""
    x, z, bn, h, a = cache
    dh = pycudnn.activation_backward(a, da, h, "relu", stream=stream)
    _, save_mean, save_invstd = bn
    dz, dgamma, dbeta = pycudnn.batch_norm_backward(z, dh, gamma, save_mean, save_invstd,
                                                    reserve=bn.reserve, stream=stream)
    dw = cp.empty_like(w)  # a convolution gradient written into a CuPy array (out=)
    pycudnn.convolution_backward_filter(x, dz, w.shape, padding=1, out=dw, stream=stream)
    dx = (pycudnn.convolution_backward_data(dz, w, x.shape, padding=1, stream=stream)
          if input_grad else None)
    # cp.asarray views a pycudnn.Tensor without a copy, for the CuPy arithmetic of Adam
    return dx, dw, cp.asarray(dgamma), cp.asarray(dbeta)


def forward(p, stats, x, stream, training):
    a1, cache1 = conv_bn_relu(x, p["w1"], p["g1"], p["b1"], stats["mean1"], stats["var1"],
                              stream, training)
    a2, cache2 = conv_bn_relu(a1, p["w2"], p["g2"], p["b2"], stats["mean2"], stats["var2"],
                              stream, training)
    pooled = pycudnn.pooling_forward(a2, 2, stride=2, mode="max", stream=stream)
    flat = cp.asarray(pooled).reshape(x.shape[0], -1)
    logits = flat @ p["w3"] + p["b3"]
    logp = pycudnn.softmax_forward(logits, algorithm="log", stream=stream)  # log-softmax over C
    return cp.asarray(logp), (cache1, cache2, a2, pooled, flat)


def loss_and_grads(p, stats, x, labels, stream):
    logp, (cache1, cache2, a2, pooled, flat) = forward(p, stats, x, stream, training=True)
    n = x.shape[0]
    rows = cp.arange(n)
    loss = -logp[rows, labels].mean()  # cross-entropy
    dlogp = cp.zeros_like(logp)
    dlogp[rows, labels] = -1.0 / n
    dlogits = cp.asarray(pycudnn.softmax_backward(logp, dlogp, algorithm="log", stream=stream))
    g = {"w3": flat.T @ dlogits, "b3": dlogits.sum(axis=0)}
    dpooled = (dlogits @ p["w3"].T).reshape(pooled.shape)
    da2 = pycudnn.pooling_backward(pooled, dpooled, a2, 2, stride=2, mode="max", stream=stream)
    da1, g["w2"], g["g2"], g["b2"] = conv_bn_relu_backward(da2, p["w2"], p["g2"], cache2, stream)
    _, g["w1"], g["g1"], g["b1"] = conv_bn_relu_backward(da1, p["w1"], p["g1"], cache1, stream,
                                                         input_grad=False)
    return loss, logp, g


class Adam:
    def __init__(self, params, lr, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t = lr, b1, b2, eps, 0
        self.m = {k: cp.zeros_like(v) for k, v in params.items()}
        self.v = {k: cp.zeros_like(v) for k, v in params.items()}

    def step(self, params, grads):
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for k, g in grads.items():
            m, v = self.m[k], self.v[k]
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            params[k] -= (self.lr / c1) * m / (cp.sqrt(v / c2) + self.eps)


def accuracy(p, stats, x, labels, stream):
    logp, _ = forward(p, stats, x, stream, training=False)
    return float((logp.argmax(axis=1) == labels).mean())


def main() -> int:
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # (1797, 1, 8, 8) in [0, 1]
    x_tr, x_te, y_tr, y_te = train_test_split(images, digits.target, test_size=0.25,
                                              random_state=0, stratify=digits.target)
    x_train, x_test = cp.asarray(x_tr), cp.asarray(x_te)
    y_train, y_test = cp.asarray(y_tr), cp.asarray(y_te)
    print(f"digits: {len(x_tr)} training and {len(x_te)} test images of 8x8, 10 classes")

    stream = pycudnn.current_stream("cupy")  # CuPy's current stream: pycudnn runs where CuPy does
    params = init_params(cp.random.default_rng(0))
    stats = init_running_stats()
    opt = Adam(params, LR)
    order_rng = np.random.default_rng(0)
    steps = len(x_tr) // BATCH  # full batches only: one shape, one algorithm search per layer

    start = time.perf_counter()
    for epoch in range(1, EPOCHS + 1):
        order = cp.asarray(order_rng.permutation(len(x_tr)))
        bar = progress(steps, f"epoch {epoch:2d}/{EPOCHS}")
        total_loss = cp.zeros((), cp.float32)
        correct = cp.zeros((), cp.int64)
        for i in range(steps):
            idx = order[i * BATCH:(i + 1) * BATCH]
            xb, yb = x_train[idx], y_train[idx]
            loss, logp, grads = loss_and_grads(params, stats, xb, yb, stream)
            opt.step(params, grads)
            total_loss += loss
            correct += (logp.argmax(axis=1) == yb).sum()
            bar.update(1)
        bar.set_postfix_str(f"loss {float(total_loss) / steps:.4f} "
                            f"train acc {int(correct) / (steps * BATCH):.3f}")
        bar.close()
    cp.cuda.get_current_stream().synchronize()
    train_s = time.perf_counter() - start

    acc = accuracy(params, stats, x_test, y_test, stream)
    ok = acc >= TARGET_ACCURACY and train_s < TIME_LIMIT_S
    print(f"train_digits_cnn: test accuracy {100 * acc:.1f}% (target >= {100 * TARGET_ACCURACY:.0f}%) "
          f"after {EPOCHS} epochs in {train_s:.1f} s (limit {TIME_LIMIT_S:.0f} s); "
          f"convolutions, batch norm, ReLU, pooling and log-softmax ran in pycudnn: "
          f"{'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if not pycudnn.device_count():
        sys.exit("train_digits_cnn.py needs an NVIDIA GPU with a working driver; none "
                 "is usable here (`pycudnn info` says why)")
    sys.exit(main())
