"""What the commands measure: `Layer` (one convolution's geometry), the built-in model layer sets
(`MODELS`), ``--shape`` and ``--shapes-file`` parsing, and the directions (fwd, dgrad, wgrad).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .errors import UsageError

DIRECTIONS = {"fwd": "forward", "dgrad": "backward_data", "wgrad": "backward_filter"}


SHORT = {v: k for k, v in DIRECTIONS.items()}


SHAPE_FORMAT = "N,C,H,W,K,R,S,stride,pad[,dilation,groups]"


@dataclass(frozen=True)
class Layer:
    """One convolution layer: input ``(n, c, *spatial)``, ``k`` filters of ``kernel``."""

    name: str
    n: int
    c: int
    spatial: tuple[int, ...]
    k: int
    kernel: tuple[int, ...]
    stride: int = 1
    pad: int = 0
    dilation: int = 1
    groups: int = 1

    @property
    def nd(self) -> int:
        return len(self.spatial)

    @property
    def out_spatial(self) -> tuple[int, ...]:
        return tuple((i + 2 * self.pad - self.dilation * (r - 1) - 1) // self.stride + 1
                     for i, r in zip(self.spatial, self.kernel))

    @property
    def x_shape(self) -> tuple[int, ...]:
        return (self.n, self.c) + self.spatial

    @property
    def w_shape(self) -> tuple[int, ...]:
        return (self.k, self.c // self.groups) + self.kernel

    @property
    def y_shape(self) -> tuple[int, ...]:
        return (self.n, self.k) + self.out_spatial

    @property
    def flops(self) -> int:
        """2 * N * K * C/groups * prod(kernel) * prod(output spatial): the same for all directions."""
        return (2 * self.n * self.k * (self.c // self.groups) * math.prod(self.kernel)
                * math.prod(self.out_spatial))

    def with_batch(self, n: int) -> "Layer":
        return dataclasses.replace(self, n=n)

    def shape_string(self) -> str:
        """The ``--shape`` string of a 2-D layer; a descriptive one for 3-D."""
        if self.nd == 2:
            s = [self.n, self.c, *self.spatial, self.k, *self.kernel, self.stride, self.pad]
            if self.dilation != 1 or self.groups != 1:
                s += [self.dilation, self.groups]
            return ",".join(map(str, s))
        return (f"{'x'.join(map(str, self.x_shape))} k{'x'.join(map(str, self.kernel))}->{self.k} "
                f"s{self.stride} p{self.pad} d{self.dilation} g{self.groups}")

    def describe(self) -> str:
        g = f" g{self.groups}" if self.groups != 1 else ""
        d = f" d{self.dilation}" if self.dilation != 1 else ""
        return (f"{self.c}->{self.k} {'x'.join(map(str, self.kernel))} s{self.stride}{d}{g} "
                f"@{'x'.join(map(str, self.spatial))}")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "n": self.n, "c": self.c, "spatial": list(self.spatial),
                "k": self.k, "kernel": list(self.kernel), "stride": self.stride, "pad": self.pad,
                "dilation": self.dilation, "groups": self.groups, "shape": self.shape_string()}


def _l2(name: str, c: int, hw: int, k: int, r: int, stride: int = 1, pad: int | None = None,
        groups: int = 1) -> Layer:
    return Layer(name, 32, c, (hw, hw), k, (r, r), stride, r // 2 if pad is None else pad, 1, groups)


def _l3(name: str, c: int, dhw: int, k: int, r: int = 3) -> Layer:
    return Layer(name, 2, c, (dhw,) * 3, k, (r,) * 3, 1, r // 2)


def _resnet50() -> list[Layer]:
    """torchvision ResNet-50's 23 distinct layers (v1.5: the stride on the 3x3): the stem, then
    per stage its first block's three convolutions and downsample, and its second block's two
    (the later blocks repeat the second)."""
    layers = [_l2("conv1", 3, 224, 64, 7, 2, 3)]
    c, hw = 64, 56
    for stage, width in enumerate((64, 128, 256, 512), 1):
        s = 1 if stage == 1 else 2
        out, p = hw // s, f"layer{stage}."
        layers += [_l2(p + "0.conv1", c, hw, width, 1), _l2(p + "0.conv2", width, hw, width, 3, s),
                   _l2(p + "0.conv3", width, out, 4 * width, 1)]
        if s != 1:  # layer1.0.downsample (64->256 1x1 @56) equals layer1.0.conv3
            layers.append(_l2(p + "0.downsample", c, hw, 4 * width, 1, s))
        layers.append(_l2(p + "1.conv1", 4 * width, out, width, 1))
        if s != 1:  # layer1.1.conv2 equals layer1.0.conv2
            layers.append(_l2(p + "1.conv2", width, out, width, 3))
        c, hw = 4 * width, out
    return layers


#: The distinct convolution layers of each built-in model (224x224 images; torchvision names).
MODELS: dict[str, list[Layer]] = {
    "resnet50": _resnet50(),
    # VGG-16: 9 distinct 3x3 layers
    "vgg16": [
        _l2("conv1_1", 3, 224, 64, 3), _l2("conv1_2", 64, 224, 64, 3),
        _l2("conv2_1", 64, 112, 128, 3), _l2("conv2_2", 128, 112, 128, 3),
        _l2("conv3_1", 128, 56, 256, 3), _l2("conv3_2", 256, 56, 256, 3),
        _l2("conv4_1", 256, 28, 512, 3), _l2("conv4_2", 512, 28, 512, 3),
        _l2("conv5_1", 512, 14, 512, 3),
    ],
    # MobileNetV2's depthwise 3x3 layers (groups = channels): 10 distinct
    "mobilenet": [
        _l2(f"features.{i}.dw", c, hw, c, 3, s, groups=c) for i, c, hw, s in (
            (1, 32, 112, 1), (2, 96, 112, 2), (3, 144, 56, 1), (4, 144, 56, 2), (5, 192, 28, 1),
            (7, 192, 28, 2), (8, 384, 14, 1), (12, 576, 14, 1), (14, 576, 14, 2), (15, 960, 7, 1))
    ],
    # 3-D U-Net (Cicek et al. 2016) on 4-channel 96^3 volumes: 15 distinct 3x3x3 / 1x1x1 layers
    "unet3d": [
        _l3("enc1.conv1", 4, 96, 32), _l3("enc1.conv2", 32, 96, 64),
        _l3("enc2.conv1", 64, 48, 64), _l3("enc2.conv2", 64, 48, 128),
        _l3("enc3.conv1", 128, 24, 128), _l3("enc3.conv2", 128, 24, 256),
        _l3("bottom.conv1", 256, 12, 256), _l3("bottom.conv2", 256, 12, 512),
        _l3("dec3.conv1", 768, 24, 256), _l3("dec3.conv2", 256, 24, 256),
        _l3("dec2.conv1", 384, 48, 128), _l3("dec2.conv2", 128, 48, 128),
        _l3("dec1.conv1", 192, 96, 64), _l3("dec1.conv2", 64, 96, 64),
        _l3("head", 64, 96, 3, 1),
    ],
}


#: default batch of each model (3-D volumes are large)
MODEL_BATCH = {"resnet50": 32, "vgg16": 32, "mobilenet": 32, "unet3d": 2}


def model_layers(model: str, batch: int | None = None) -> list[Layer]:
    """The distinct layers of a built-in model at ``batch`` (default: the model's)."""
    if model not in MODELS:
        raise UsageError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}")
    n = batch or MODEL_BATCH[model]
    return [layer.with_batch(n) for layer in MODELS[model]]


def parse_shape(text: str, name: str | None = None) -> Layer:
    """A layer from ``N,C,H,W,K,R,S,stride,pad[,dilation,groups]``; UsageError when malformed."""
    items = [t.strip() for t in str(text).split(",")]
    where = f"shape {text!r}"
    if len(items) not in (9, 11):
        raise UsageError(f"{where}: expected 9 or 11 comma-separated integers {SHAPE_FORMAT}, "
                         f"got {len(items)}")
    try:
        v = [int(t) for t in items]
    except ValueError:
        raise UsageError(f"{where}: expected integers {SHAPE_FORMAT}") from None
    n, c, h, w, k, r, s, stride, pad = v[:9]
    dilation, groups = (v[9], v[10]) if len(v) == 11 else (1, 1)
    for label, value, low in (("N", n, 1), ("C", c, 1), ("H", h, 1), ("W", w, 1), ("K", k, 1),
                              ("R", r, 1), ("S", s, 1), ("stride", stride, 1), ("pad", pad, 0),
                              ("dilation", dilation, 1), ("groups", groups, 1)):
        if value < low:
            raise UsageError(f"{where}: {label} must be >= {low}, got {value}")
    if c % groups or k % groups:
        raise UsageError(f"{where}: C={c} and K={k} must both be divisible by groups={groups}")
    layer = Layer(name or str(text).replace(" ", ""), n, c, (h, w), k, (r, s), stride, pad,
                  dilation, groups)
    if any(o < 1 for o in layer.out_spatial):
        raise UsageError(f"{where}: the output would be {list(layer.out_spatial)} (kernel larger "
                         f"than the padded input)")
    return layer


def _shapes_file(file: str) -> list[Layer]:
    try:
        with open(file, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise UsageError(f"shapes file {file!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read shapes file {file!r}: {exc}") from None
    layers = []
    for i, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            layers.append(parse_shape(text))
        except UsageError as exc:
            raise UsageError(f"{file}:{i}: {exc}") from None
    if not layers:
        raise UsageError(f"shapes file {file!r} holds no shape (one {SHAPE_FORMAT} per line)")
    return layers


def layers_from_args(args: argparse.Namespace) -> list[Layer]:
    """The distinct layers that ``bench`` or ``tune`` arguments (from `build_parser()`) name:
    the ``--model``'s layers (ResNet-50's when no layer is named), then the ``--shapes-file``
    and ``--shape`` rows, with ``--batch`` applied."""
    layers: list[Layer] = []
    if getattr(args, "shapes_file", None):
        layers += _shapes_file(args.shapes_file)
    if args.shape:
        layers += [parse_shape(s) for s in args.shape]
    if args.model or not layers:
        layers = model_layers(args.model or "resnet50", args.batch) + layers
    if args.batch:
        layers = [layer.with_batch(args.batch) for layer in layers]
    seen, out = set(), []
    for layer in layers:  # distinct only
        key = dataclasses.replace(layer, name="")
        if key not in seen:
            seen.add(key)
            out.append(layer)
    return out


def parse_directions(value: str) -> list[str]:
    return list(DIRECTIONS.values()) if value == "all" else [DIRECTIONS[value]]
