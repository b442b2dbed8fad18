"""Train a small CNN on scikit-learn's digits (8x8 images, no download): pycudnn does every
convolution, forward and backward, and CuPy does the rest (ReLU masks, pooling, the dense layer,
softmax cross-entropy, Adam).

Needs: an NVIDIA GPU, CuPy and scikit-learn; tqdm draws the progress bar when installed (from a
checkout: pip install -e ".[cu12,examples]", or ".[cu13,examples-cu13]" for CUDA 13).
Run:  python examples/train_digits_cnn.py
It prints a progress bar per epoch (tqdm when installed), the test accuracy and the training time,
and exits with status 1 unless the accuracy is at least 95% and training took under a minute.

    input (N, 1, 8, 8)
    conv 3x3, 16 channels, padding 1, bias, ReLU    pycudnn.convolution(..., activation="relu")
    conv 3x3, 32 channels, padding 1, bias, ReLU    (the graph engine fuses bias and ReLU)
    max pool 2x2                 -> (N, 32, 4, 4)   CuPy
    dense 512 -> 10, softmax cross-entropy          CuPy
"""

from __future__ import annotations

import sys
import time

import numpy as np

try:
    import cupy as cp
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
except ImportError as exc:
    sys.exit(f"train_digits_cnn.py needs CuPy and scikit-learn ({exc.name} is missing): "
             'pip install -e ".[cu12,examples]" (CUDA 13: ".[cu13,examples-cu13]")')

import pycudnn

EPOCHS = 20
BATCH = 64
LR = 3e-3
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

    return {
        "w1": he((16, 1, 3, 3), 9), "b1": cp.zeros(16, cp.float32),
        "w2": he((32, 16, 3, 3), 16 * 9), "b2": cp.zeros(32, cp.float32),
        "w3": he((512, 10), 512), "b3": cp.zeros(10, cp.float32),
    }


def maxpool2(a):
    """2x2 max pooling of (N, C, H, W); returns the pooled array and the routing mask (ties
    share the gradient)."""
    n, c, h, w = a.shape
    r = a.reshape(n, c, h // 2, 2, w // 2, 2)
    m = r.max(axis=(3, 5))
    mask = (r == m[:, :, :, None, :, None]).astype(a.dtype)
    mask /= mask.sum(axis=(3, 5), keepdims=True)
    return m, mask


def maxpool2_backward(g, mask):
    n, c, h2, w2 = g.shape
    return (mask * g[:, :, :, None, :, None]).reshape(n, c, 2 * h2, 2 * w2)


def forward(p, x, stream):
    # pycudnn returns a pycudnn.Tensor; cp.asarray views it without a copy
    a1 = cp.asarray(pycudnn.convolution(x, p["w1"], p["b1"], padding=1, activation="relu",
                                        stream=stream))
    a2 = cp.asarray(pycudnn.convolution(a1, p["w2"], p["b2"], padding=1, activation="relu",
                                        stream=stream))
    pooled, mask = maxpool2(a2)
    flat = pooled.reshape(x.shape[0], -1)
    logits = flat @ p["w3"] + p["b3"]
    return logits, (a1, a2, mask, flat)


def loss_and_grads(p, x, labels, stream):
    logits, (a1, a2, mask, flat) = forward(p, x, stream)
    n = x.shape[0]
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - cp.log(cp.exp(z).sum(axis=1, keepdims=True))
    loss = -logp[cp.arange(n), labels].mean()
    dlogits = cp.exp(logp)
    dlogits[cp.arange(n), labels] -= 1
    dlogits /= n
    g = {"w3": flat.T @ dlogits, "b3": dlogits.sum(axis=0)}
    dflat = dlogits @ p["w3"].T
    dz2 = maxpool2_backward(dflat.reshape(n, 32, 4, 4), mask) * (a2 > 0)
    # every convolution gradient comes from pycudnn, written into CuPy arrays (out=)
    g["w2"] = cp.empty_like(p["w2"])
    pycudnn.convolution_backward_filter(a1, dz2, p["w2"].shape, padding=1, out=g["w2"], stream=stream)
    g["b2"] = dz2.sum(axis=(0, 2, 3))
    da1 = cp.empty_like(a1)
    pycudnn.convolution_backward_data(dz2, p["w2"], a1.shape, padding=1, out=da1, stream=stream)
    dz1 = da1 * (a1 > 0)
    g["w1"] = cp.empty_like(p["w1"])
    pycudnn.convolution_backward_filter(x, dz1, p["w1"].shape, padding=1, out=g["w1"], stream=stream)
    g["b1"] = dz1.sum(axis=(0, 2, 3))
    return loss, logits, g


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


def accuracy(p, x, labels, stream):
    logits, _ = forward(p, x, stream)
    return float((logits.argmax(axis=1) == labels).mean())


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
            loss, logits, grads = loss_and_grads(params, xb, yb, stream)
            opt.step(params, grads)
            total_loss += loss
            correct += (logits.argmax(axis=1) == yb).sum()
            bar.update(1)
        bar.set_postfix_str(f"loss {float(total_loss) / steps:.4f} "
                            f"train acc {int(correct) / (steps * BATCH):.3f}")
        bar.close()
    cp.cuda.get_current_stream().synchronize()
    train_s = time.perf_counter() - start

    acc = accuracy(params, x_test, y_test, stream)
    ok = acc >= TARGET_ACCURACY and train_s < TIME_LIMIT_S
    print(f"train_digits_cnn: test accuracy {100 * acc:.1f}% (target >= {100 * TARGET_ACCURACY:.0f}%) "
          f"after {EPOCHS} epochs in {train_s:.1f} s (limit {TIME_LIMIT_S:.0f} s); every "
          f"convolution forward and backward ran in pycudnn: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if not pycudnn.device_count():
        sys.exit("train_digits_cnn.py needs an NVIDIA GPU with a working driver; none "
                 "is usable here (`pycudnn info` says why)")
    sys.exit(main())
