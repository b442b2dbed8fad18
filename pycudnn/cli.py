"""The ``pycudnn`` command line (also ``python -m pycudnn``).

Subcommands:

* ``pycudnn info``: versions, where libcudnn came from, devices, the tuning database;
* ``pycudnn bench``: time convolution layers (built-in ResNet-50 by default), against PyTorch when
  it is installed; results go to the tuning database;
* ``pycudnn tune``: fill the tuning database for a list of layers ahead of time;
* ``pycudnn cache show [FILE]|clear|export FILE|import FILE [--replace]``: the tuning database.

User mistakes (a bad ``--shape``, an unknown model, a missing file) print one line on stderr and
exit with status 2; a machine that cannot run the command (no GPU, no libcudnn) prints one line
and exits with status 1. Never a traceback, except with ``--debug``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Sequence

from ._types import MathType
from .configuration import config, flags
from .errors import CudnnNotFoundError
from .ffi import library as _lib
from .ffi.backend import BehaviorNote, NumericalNote
from .runtime.memory import check_cuda, device_count, device_guard, empty_cache, no_device_reason
from .search import algos, tuning_db
from .dispatch.engines import strategy_for

__all__ = ["main", "build_parser", "Layer", "MODELS", "MODEL_BATCH", "parse_shape", "model_layers",
           "UsageError", "RunError", "layers_from_args", "options_from_args", "ROW_FIELDS", "new_row",
           "run_layer", "candidate_row", "cuda_mismatches", "pip_install_command", "terminal_safe"]

DIRECTIONS = {"fwd": "forward", "dgrad": "backward_data", "wgrad": "backward_filter"}
SHORT = {v: k for k, v in DIRECTIONS.items()}
#: --dtype -> (pycudnn dtype, allow_tf32 to pass; None leaves pycudnn.config's)
DTYPES: dict[str, tuple[str, bool | None]] = {
    "bfloat16": ("bfloat16", None), "float16": ("float16", None), "tf32": ("float32", True),
    "float32": ("float32", False), "float64": ("float64", None),
}
SHAPE_FORMAT = "N,C,H,W,K,R,S,stride,pad[,dilation,groups]"


class UsageError(Exception):
    """A mistake on the command line or in a file it names (exit status 2)."""


class _ParseError(UsageError):
    """An argparse mistake; the message already names the (sub)command."""


class RunError(Exception):
    """The command cannot run here (no GPU, no libcudnn) or failed (exit status 1)."""


# ---- layers ---------------------------------------------------------------------------------------

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


#: The distinct convolution layers of each built-in model (224x224 images; torchvision names).
MODELS: dict[str, list[Layer]] = {
    # torchvision ResNet-50 (v1.5: stride on the 3x3): 23 distinct layers; layer1.0.downsample
    # (64->256 1x1 @56) equals layer1.0.conv3 and is listed once
    "resnet50": [
        _l2("conv1", 3, 224, 64, 7, 2, 3),
        _l2("layer1.0.conv1", 64, 56, 64, 1),
        _l2("layer1.0.conv2", 64, 56, 64, 3),
        _l2("layer1.0.conv3", 64, 56, 256, 1),
        _l2("layer1.1.conv1", 256, 56, 64, 1),
        _l2("layer2.0.conv1", 256, 56, 128, 1),
        _l2("layer2.0.conv2", 128, 56, 128, 3, 2),
        _l2("layer2.0.conv3", 128, 28, 512, 1),
        _l2("layer2.0.downsample", 256, 56, 512, 1, 2),
        _l2("layer2.1.conv1", 512, 28, 128, 1),
        _l2("layer2.1.conv2", 128, 28, 128, 3),
        _l2("layer3.0.conv1", 512, 28, 256, 1),
        _l2("layer3.0.conv2", 256, 28, 256, 3, 2),
        _l2("layer3.0.conv3", 256, 14, 1024, 1),
        _l2("layer3.0.downsample", 512, 28, 1024, 1, 2),
        _l2("layer3.1.conv1", 1024, 14, 256, 1),
        _l2("layer3.1.conv2", 256, 14, 256, 3),
        _l2("layer4.0.conv1", 1024, 14, 512, 1),
        _l2("layer4.0.conv2", 512, 14, 512, 3, 2),
        _l2("layer4.0.conv3", 512, 7, 2048, 1),
        _l2("layer4.0.downsample", 1024, 14, 2048, 1, 2),
        _l2("layer4.1.conv1", 2048, 7, 512, 1),
        _l2("layer4.1.conv2", 512, 7, 512, 3),
    ],
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


def _directions(value: str) -> list[str]:
    return list(DIRECTIONS.values()) if value == "all" else [DIRECTIONS[value]]


# ---- small helpers --------------------------------------------------------------------------------

def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.{digits}f}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.split("\n", 1)[0] if text else type(exc).__name__


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: set[int] | None = None) -> str:
    right = right or set()
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for j, row in enumerate(cells):
        out.append("  ".join(c.rjust(widths[i]) if i in right else c.ljust(widths[i])
                             for i, c in enumerate(row)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:  # noqa: BLE001 - not installed
        return None


class _Progress:
    """A progress bar on stderr: tqdm when importable, else plain ``\\r`` text (a line per step
    when stderr is not a terminal)."""

    def __init__(self, total: int, what: str, quiet: bool = False) -> None:
        self.total, self.what, self.quiet, self.n = total, what, quiet, 0
        self.tty = sys.stderr.isatty()
        self._bar = None
        self._width = 0
        if not quiet and importlib.util.find_spec("tqdm") is not None:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=what, file=sys.stderr, leave=False,
                                 dynamic_ncols=True)
            except Exception:  # noqa: BLE001
                self._bar = None

    def step(self, desc: str) -> None:
        """Announce the step about to run."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(desc, refresh=True)
            return
        text = f"{self.what} [{self.n + 1:>{len(str(self.total))}}/{self.total}] {desc}"
        if self.tty:
            pad = max(0, self._width - len(text))
            sys.stderr.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        """The announced step finished."""
        self.n += 1
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.tty and not self.quiet and self._width:
            sys.stderr.write("\r" + " " * self._width + "\r")
            sys.stderr.flush()


# ---- environment checks ---------------------------------------------------------------------------

def _require_gpu(command: str, device: int = 0) -> None:
    """RunError (one line) when this machine cannot run convolutions."""

    reason = no_device_reason()
    if reason is not None:
        raise RunError(f"pycudnn {command}: no usable CUDA GPU on this machine ({reason}); "
                       f"`pycudnn info` shows what pycudnn sees")
    n = device_count()
    if not 0 <= device < n:
        raise UsageError(f"--device {device}: this machine has {n} CUDA device(s) (0..{n - 1})")
    try:
        _lib.lib()
    except CudnnNotFoundError:
        raise RunError(f"pycudnn {command}: libcudnn could not be loaded; {_lib.INSTALL_HINT} "
                       f"(`pycudnn info` lists where it looked)") from None


def _devices() -> tuple[list[dict[str, Any]], str | None]:
    """(devices, None) or ([], why there is none)."""
    from cuda.bindings import runtime as rt


    reason = no_device_reason()
    if reason is not None:
        return [], reason
    out = []
    for i in range(device_count()):
        err, prop = rt.cudaGetDeviceProperties(i)
        if int(err):
            out.append({"index": i, "error": str(err)})
            continue
        name = prop.name
        if isinstance(name, (bytes, bytearray)):
            name = bytes(name).split(b"\0", 1)[0].decode("utf-8", "replace")
        out.append({"index": i, "name": str(name).strip(),
                    "compute_capability": [int(prop.major), int(prop.minor)],
                    "sm_count": int(prop.multiProcessorCount),
                    "memory_bytes": int(prop.totalGlobalMem)})
    return out, None


def _version_text(v: int) -> str:
    return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"


def _cuda_text(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def pip_install_command(extra: str) -> str:
    """The command that installs pycudnn with ``extra``: from this checkout when it is one."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(root, "pyproject.toml")):
        return f'pip install -e "{root}[{extra}]"'
    return f'pip install "pycudnn-ctypes[{extra}]"'


def _major(text: Any) -> int | None:
    try:
        return int(str(text).split(".")[0])
    except ValueError:
        return None


def cuda_mismatches(info: dict[str, Any]) -> list[str]:
    """What ``pycudnn info`` warns about: cuDNN, cuda-bindings and the driver from CUDA majors
    that do not work together, and what to do (one line each)."""
    packages = info.get("packages", {})
    cudnn = _major(info.get("cudnn", {}).get("cuda_runtime"))
    bindings = _major(info.get("cuda_python_runtime") or packages.get("cuda-bindings"))
    driver = _major(info.get("cuda_driver")) if info.get("cuda_driver") else None
    out = []
    if packages.get("nvidia-cudnn-cu12") and packages.get("nvidia-cudnn-cu13"):
        keep = bindings or 12
        out.append(f"nvidia-cudnn-cu12 and nvidia-cudnn-cu13 are both installed and write the same "
                   f"libcudnn.so.9 (the one installed last is used): use one CUDA major here, e.g. "
                   f"pip uninstall nvidia-cudnn-cu12 nvidia-cudnn-cu13, then "
                   f"{pip_install_command(f'cu{keep}')} and the CUDA {keep} builds of other packages")
    if cudnn is not None and bindings is not None and cudnn != bindings:
        out.append(f"cuDNN is built for CUDA {cudnn} but cuda-bindings is for CUDA {bindings}: "
                   f"another package (often a PyTorch or CuPy wheel) brought one of them; use one "
                   f"CUDA major in this environment, e.g. {pip_install_command(f'cu{cudnn}')} to follow "
                   f"cuDNN, or {pip_install_command(f'cu{bindings}')} and that package's CUDA {bindings} "
                   f"build")
    if driver is not None:
        newer = sorted({m for m in (cudnn, bindings) if m is not None and m > driver})
        if newer:
            out.append(f"the driver supports CUDA {info['cuda_driver']}, older than CUDA "
                       f"{newer[-1]} that {'cuDNN' if cudnn == newer[-1] else 'cuda-bindings'} "
                       f"needs: update the NVIDIA driver, or install the CUDA {driver} build: "
                       f"{pip_install_command(f'cu{driver}')}")
    return out


# ---- info -----------------------------------------------------------------------------------------

def cmd_info(args: argparse.Namespace) -> int:
    """Versions, libcudnn, devices and the tuning database; works without a GPU or libcudnn."""
    import platform

    import pycudnn


    info: dict[str, Any] = {"pycudnn": pycudnn.__version__,
                            "pycudnn_path": os.path.dirname(os.path.abspath(pycudnn.__file__)),
                            "python": platform.python_version()}
    try:
        library = _lib.lib()
        info["cudnn"] = {"version": _version_text(_lib.version()), "path": library.path,
                         "found_via": library.found_via,
                         "cuda_runtime": _cuda_text(_lib.cudart_version())}
    except CudnnNotFoundError as exc:
        info["cudnn"] = {"error": "not found", "install": _lib.INSTALL_HINT,
                         "tried": [line.strip()[2:] for line in str(exc).splitlines()
                                   if line.startswith("  - ")]}
    try:
        from cuda.bindings import runtime as rt

        err, drv = rt.cudaDriverGetVersion()
        info["cuda_driver"] = _cuda_text(drv) if not int(err) and drv else None
        err, rtv = rt.cudaRuntimeGetVersion()
        info["cuda_python_runtime"] = _cuda_text(rtv) if not int(err) else None
        devices, reason = _devices()
    except Exception as exc:  # noqa: BLE001 - cuda.bindings itself broken
        info["cuda_driver"], devices, reason = None, [], f"{type(exc).__name__}: {exc}"
    info["devices"] = devices
    info["no_gpu_reason"] = reason
    db: dict[str, Any] = {"path": tuning_db.path(), "enabled": tuning_db.enabled()}
    try:
        db["entries"] = len(tuning_db.entries())
    except OSError as exc:
        db["error"] = str(exc)
    info["tuning_db"] = db
    info["packages"] = {name: _dist_version(name) for name in (
        "cuda-python", "cuda-bindings", "cuda-core", "cuda-pathfinder", "numpy", "ml_dtypes",
        "nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "torch", "cupy-cuda12x", "cupy-cuda13x")}
    info["cuda_mismatch"] = cuda_mismatches(info)

    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    out = [f"pycudnn      {info['pycudnn']} ({info['pycudnn_path']}), Python {info['python']}"]
    c = info["cudnn"]
    cuda = []
    if "error" in c:
        out.append(f"cuDNN        not found: {c['install']}")
        out.extend(f"               tried {t}" for t in c["tried"])
    else:
        out.append(f"cuDNN        {c['version']} at {c['path']}")
        out.append(f"               found via {c['found_via']}")
        cuda.append(f"cuDNN built for CUDA {c['cuda_runtime']}")
    if info.get("cuda_python_runtime"):
        cuda.append(f"cuda-bindings for CUDA {info['cuda_python_runtime']}")
    cuda.append(f"driver supports CUDA {info['cuda_driver']}" if info["cuda_driver"]
                else "no NVIDIA driver found")
    out.append("CUDA         " + "; ".join(cuda))
    out.extend(f"warning      {line}" for line in info["cuda_mismatch"])
    if devices:
        for d in devices:
            if "error" in d:
                out.append(f"GPU {d['index']}        error: {d['error']}")
            else:
                cc = ".".join(map(str, d["compute_capability"]))
                out.append(f"GPU {d['index']}        {d['name']}, compute capability {cc}, "
                           f"{d['sm_count']} SMs, {_fmt_bytes(d['memory_bytes'])}")
    else:
        out.append(f"GPU          no GPU: {reason}")
    state = "" if db["enabled"] else " [disabled: PYCUDNN_TUNING_DB=0 or config.tuning_db=False]"
    count = f"{db['entries']} records" if "entries" in db else f"unreadable: {db.get('error')}"
    out.append(f"tuning DB    {db['path']} ({count}){state}")
    pk = ", ".join(f"{k} {v}" for k, v in info["packages"].items() if v)
    out.append(f"packages     {pk}")
    print("\n".join(out))
    return 0


# ---- running one layer ----------------------------------------------------------------------------

class _Buffers:
    """Device tensors of one layer, made on first need and shared by the three directions."""

    def __init__(self, layer: Layer, dtype: str, fmt: str, device: int) -> None:
        self.layer, self.dtype, self.fmt, self.device = layer, dtype, fmt, device
        self._t: dict[str, Any] = {}
        self._torch: dict[str, Any] = {}

    def _make(self, shape: tuple[int, ...], fill: bool) -> Any:
        import numpy as np

        import pycudnn

        if not fill:
            return pycudnn.empty(shape, self.dtype, memory_format=self.fmt, device=self.device)
        pool = _random_pool()
        host = np.resize(pool, math.prod(shape)).reshape(shape)
        return pycudnn.from_numpy(host, dtype=self.dtype, memory_format=self.fmt, device=self.device)

    def get(self, name: str) -> Any:
        t = self._t.get(name)
        if t is None:
            lay = self.layer
            shape = {"x": lay.x_shape, "w": lay.w_shape, "dy": lay.y_shape, "y": lay.y_shape,
                     "dx": lay.x_shape, "dw": lay.w_shape}[name]
            t = self._t[name] = self._make(shape, fill=name in ("x", "w", "dy"))
        return t

    def torch(self, name: str) -> Any:
        t = self._torch.get(name)
        if t is None:
            import torch

            t = self._torch[name] = torch.from_dlpack(self.get(name))
        return t


_pool: list[Any] = []


def _random_pool() -> Any:
    if not _pool:
        import numpy as np

        _pool.append((np.random.default_rng(0).random(1 << 20, dtype=np.float32) - 0.5))
    return _pool[0]


def _pycudnn_fn(layer: Layer, direction: str, bufs: _Buffers, flags: dict[str, Any]) -> Callable[[], Any]:
    import pycudnn

    kw = dict(stride=layer.stride, padding=layer.pad, dilation=layer.dilation, groups=layer.groups,
              **flags)
    if direction == "forward":
        x, w, y = bufs.get("x"), bufs.get("w"), bufs.get("y")
        return lambda: pycudnn.convolution(x, w, out=y, **kw)
    if direction == "backward_data":
        dy, w, dx = bufs.get("dy"), bufs.get("w"), bufs.get("dx")
        return lambda: pycudnn.convolution_backward_data(dy, w, layer.x_shape, out=dx, **kw)
    x, dy, dw = bufs.get("x"), bufs.get("dy"), bufs.get("dw")
    return lambda: pycudnn.convolution_backward_filter(x, dy, layer.w_shape, out=dw, **kw)


def _torch_fn(layer: Layer, direction: str, bufs: _Buffers) -> Callable[[], Any]:
    import torch
    import torch.nn.functional as F

    nd = layer.nd
    s, p, d = [layer.stride] * nd, [layer.pad] * nd, [layer.dilation] * nd
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    x, w = bufs.torch("x"), bufs.torch("w")
    if direction == "forward":
        return lambda: conv(x, w, None, s, p, d, layer.groups)
    dy = bufs.torch("dy")
    mask = [True, False, False] if direction == "backward_data" else [False, True, False]
    op = torch.ops.aten.convolution_backward
    return lambda: op(dy, x, w, None, s, p, d, False, [0] * nd, layer.groups, mask)


class _CudaTimer:
    """CUDA events on the legacy default stream (where pycudnn runs without ``stream=``)."""

    def __init__(self) -> None:
        from cuda.bindings import runtime as rt

        self.rt = rt
        self.ev0 = rt.cudaEventCreate()[1]
        self.ev1 = rt.cudaEventCreate()[1]

    def start(self) -> None:
        self.rt.cudaEventRecord(self.ev0, 0)

    def stop(self) -> float:

        self.rt.cudaEventRecord(self.ev1, 0)
        check_cuda(self.rt.cudaEventSynchronize(self.ev1)[0], "cudaEventSynchronize")
        err, ms = self.rt.cudaEventElapsedTime(self.ev0, self.ev1)
        check_cuda(err, "cudaEventElapsedTime")
        return float(ms)

    def sync(self) -> None:

        check_cuda(self.rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def close(self) -> None:
        self.rt.cudaEventDestroy(self.ev0)
        self.rt.cudaEventDestroy(self.ev1)


class _TorchTimer:
    """CUDA events on PyTorch's current stream."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.ev0 = torch.cuda.Event(enable_timing=True)
        self.ev1 = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self.ev0.record()

    def stop(self) -> float:
        self.ev1.record()
        self.ev1.synchronize()
        return float(self.ev0.elapsed_time(self.ev1))

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def close(self) -> None:
        pass


def _first_call(fn: Callable[[], Any], timer: _CudaTimer | _TorchTimer) -> float:
    """Wall milliseconds until the first call's convolution has finished (search included)."""
    timer.sync()
    t0 = time.perf_counter()
    fn()
    timer.sync()
    return (time.perf_counter() - t0) * 1e3


def _steady(fn: Callable[[], Any], timer: _CudaTimer | _TorchTimer, trials: int = 7,
            trial_ms: float = 5.0) -> float:
    """Median over ``trials`` of the mean time per call of back-to-back calls (ms), host cost
    included; each trial runs about ``trial_ms``."""
    fn()
    timer.start()
    fn()
    one = max(timer.stop(), 1e-3)
    reps = max(1, min(200, int(math.ceil(trial_ms / one))))
    samples = []
    for _ in range(trials):
        timer.start()
        for _ in range(reps):
            fn()
        samples.append(timer.stop() / reps)
    return statistics.median(samples)


class _CandidateSpy:
    """Keeps what the engine's ``candidates()`` returned during a measured search (what
    ``--all-candidates`` shows); installed on the strategy instance, removed on exit."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy
        self.seen: list[Any] = []

    def __enter__(self) -> "_CandidateSpy":
        real = self.strategy.candidates

        def spy(args: Any) -> Any:
            got = real(args)
            if args.benchmark:
                got = list(got)
                self.seen.extend(got)
            return got

        self.strategy.candidates = spy
        return self

    def __exit__(self, *exc: Any) -> None:
        self.strategy.__dict__.pop("candidates", None)


def _note_name(enum: Any, value: Any) -> str:
    try:
        return enum(int(value)).name
    except (ValueError, TypeError):
        return str(value)


def candidate_row(rec: Any) -> dict[str, Any]:
    """Choice, measured time, workspace and notes of one candidate (graph plan or v7 algorithm)."""
    plan = getattr(rec, "plan", None)
    if plan is not None:

        notes = [_note_name(NumericalNote, n) for n in getattr(plan, "notes", ())]
        notes += [_note_name(BehaviorNote, n) for n in getattr(plan, "behavior_notes", ())]
        return {"choice": plan.tag, "time_ms": rec.time_ms if rec.time_ms >= 0 else None,
                "workspace": plan.workspace_size if plan.finalized else None,
                "notes": notes, "source": rec.source, "detail": rec.describe()}

    try:
        math_name = MathType(rec.math_type).name
    except ValueError:
        math_name = str(rec.math_type)
    return {"choice": f"{rec.algo_name.split('.')[-1]} {math_name}",
            "time_ms": rec.time_ms if rec.time_ms >= 0 else None, "workspace": rec.workspace,
            "notes": ["deterministic" if rec.deterministic else "non-deterministic"],
            "source": rec.source, "detail": rec.describe()}


def _store_winners(direction: str, strategy: Any) -> None:
    """After a search run with the database off (--fresh/--all-candidates): keep the winner."""

    if not tuning_db.enabled():
        return
    for params, record in algos.caches[direction].items():
        if record.source in ("measured", "find"):
            try:
                tuning_db.store(params, strategy.serialize(record))
            except OSError as exc:
                print(f"warning: could not write the tuning database: {exc}", file=sys.stderr)


#: what every result row holds (None until measured)
ROW_FIELDS = ("layer", "shape", "direction", "gflop", "ms", "tflops", "first_call_ms", "choice",
              "choice_detail", "choice_ms", "workspace", "source", "searches", "torch_ms", "torch_tflops",
              "torch_first_call_ms", "torch_over_pycudnn", "error", "torch_error")


def new_row(layer: Layer, direction: str) -> dict[str, Any]:
    """A result row for ``layer`` in ``direction``: every field of `ROW_FIELDS`, unmeasured."""
    row: dict[str, Any] = dict.fromkeys(ROW_FIELDS)
    row.update(layer=layer.name, shape=layer.as_dict(), direction=direction, gflop=layer.flops / 1e9)
    return row


def run_layer(layer: Layer, direction: str, bufs: _Buffers, opts: dict[str, Any],
              torch_on: bool, measure: bool = True) -> dict[str, Any]:
    """Search (or reuse) and time one layer in one direction, with `options_from_args()`'s
    ``opts`` and ``bench``'s device buffers ``bufs``; torch too when ``torch_on``. Returns the
    row (see `new_row()`); a failure is the row's ``error``, not an exception."""
    import pycudnn


    strategy = strategy_for(opts["engine"])
    row = new_row(layer, direction)
    pycudnn.clear_caches()
    fn = _pycudnn_fn(layer, direction, bufs, opts["flags"])
    timer = _CudaTimer()
    try:
        fresh = opts["fresh"] or opts["all_candidates"]
        with _CandidateSpy(strategy) as spy:
            if fresh:
                with flags(tuning_db=False):
                    row["first_call_ms"] = _first_call(fn, timer)
                if opts["use_db"]:
                    _store_winners(direction, strategy)
            else:
                row["first_call_ms"] = _first_call(fn, timer)
        cached = algos.caches[direction].items()
        row["searches"] = algos.caches[direction].searches
        if cached:
            record = cached[-1][1]
            info = candidate_row(record)
            row.update(choice=info["choice"], choice_detail=info["detail"],
                       choice_ms=info["time_ms"], workspace=info["workspace"],
                       source=info["source"])
        if opts["all_candidates"]:
            row["candidates"] = [candidate_row(r) for r in spy.seen]
        if measure:
            row["ms"] = _steady(fn, timer)
            row["tflops"] = layer.flops / (row["ms"] * 1e-3) / 1e12
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - one failing layer must not stop the others
        row["error"] = f"{type(exc).__name__}: {_first_line(exc)}"
    finally:
        timer.close()
    if torch_on and measure:
        try:
            tfn = _torch_fn(layer, direction, bufs)
            ttimer = _TorchTimer()
            row["torch_first_call_ms"] = _first_call(tfn, ttimer)
            row["torch_ms"] = _steady(tfn, ttimer)
            row["torch_tflops"] = layer.flops / (row["torch_ms"] * 1e-3) / 1e12
            if row["ms"]:
                row["torch_over_pycudnn"] = row["torch_ms"] / row["ms"]
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001
            row["torch_error"] = f"{type(exc).__name__}: {_first_line(exc)}"
    return row


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """What ``bench`` or ``tune`` arguments ask of each measurement: ``dtype``, ``fmt``
    (``"channels_last"`` or ``"contiguous"``), the pycudnn ``flags`` of the calls, ``use_db``,
    and the other options `run_layer()` reads."""

    dtype, tf32 = DTYPES[args.dtype]
    engine = args.engine or config.engine
    fl: dict[str, Any] = {"benchmark": True, "engine": engine}
    if tf32 is not None:
        fl["allow_tf32"] = tf32
    use_db = not getattr(args, "no_tuning_db", False) and tuning_db.enabled()
    fmt = "channels_last" if args.layout == "nhwc" else "contiguous"
    return {"dtype": dtype, "fmt": fmt, "engine": engine, "flags": fl, "use_db": use_db,
            "fresh": getattr(args, "fresh", False),
            "all_candidates": getattr(args, "all_candidates", False)}


def _free_memory(device: int, torch_on: bool) -> None:

    try:
        if torch_on:
            import torch

            torch.cuda.empty_cache()
        empty_cache(device)
    except Exception:  # noqa: BLE001 - best effort
        pass


def _check_output_path(option: str, file: str | None) -> None:
    if file:
        parent = os.path.dirname(os.path.abspath(file))
        if not os.path.isdir(parent):
            raise UsageError(f"{option} {file}: directory {parent} does not exist")


def _run_all(layers: list[Layer], directions: list[str], opts: dict[str, Any], device: int,
             torch_on: bool, quiet: bool, what: str, measure: bool) -> list[dict[str, Any]]:

    rows = []
    progress = _Progress(len(layers) * len(directions), what, quiet)
    try:
        with device_guard(device), flags(tuning_db=opts["use_db"]):
            for layer in layers:
                bufs = _Buffers(layer, opts["dtype"], opts["fmt"], device)
                for direction in directions:
                    progress.step(f"{layer.name} {SHORT[direction]}")
                    rows.append(run_layer(layer, direction, bufs, opts, torch_on, measure))
                    progress.done()
                del bufs
                _free_memory(device, torch_on)
    finally:
        progress.close()
    return rows


# ---- bench ----------------------------------------------------------------------------------------

def _torch_available(args: argparse.Namespace) -> tuple[bool, str | None]:
    if args.no_torch:
        return False, "--no-torch"
    if importlib.util.find_spec("torch") is None:
        return False, "PyTorch is not installed"
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return False, f"import torch failed: {_first_line(exc)}"
    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False"
    torch.cuda.set_device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = False
    tf32 = DTYPES[args.dtype][1]
    torch.backends.cudnn.allow_tf32 = True if tf32 is None else tf32
    return True, None


def cmd_bench(args: argparse.Namespace) -> int:
    """Time layers with benchmark=True (and PyTorch's cuDNN path when installed)."""

    layers = layers_from_args(args)
    directions = _directions(args.direction)
    for option in ("json", "csv", "plot"):
        _check_output_path(f"--{option}", getattr(args, option))
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib, which is not installed (pip install matplotlib)")
    _require_gpu("bench", args.device)
    opts = options_from_args(args)
    torch_on, torch_why = _torch_available(args)
    meta = _meta(args, opts, layers, directions)
    meta["torch"] = _dist_version("torch") if torch_on else None
    meta["torch_skipped"] = torch_why
    if not args.quiet:
        print(_header(meta), file=sys.stderr)
    rows = _run_all(layers, directions, opts, args.device, torch_on, args.quiet, "bench", True)
    meta["tuning_db_entries"] = len(tuning_db.entries()) if opts["use_db"] else None
    print(_bench_table(rows, torch_on, args.all_candidates))
    print(_summary(rows, meta, torch_on))
    result = dict(meta, rows=rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    if args.csv:
        _write_csv(args.csv, rows)
    if args.plot:
        _plot(args.plot, rows, meta, torch_on)
    failed = [r for r in rows if r["error"]]
    if failed:
        print(f"pycudnn bench: {len(failed)} of {len(rows)} measurements failed (see the table)",
              file=sys.stderr)
        return 1
    return 0


def _meta(args: argparse.Namespace, opts: dict[str, Any], layers: list[Layer],
          directions: list[str]) -> dict[str, Any]:
    import pycudnn


    devices, _ = _devices()
    dev = next((d for d in devices if d.get("index") == args.device), {})
    return {"pycudnn": pycudnn.__version__, "cudnn": _version_text(_lib.version()),
            "cuda_runtime": _cuda_text(_lib.cudart_version()), "device": dev,
            "settings": {"model": args.model or ("resnet50" if not (args.shape or getattr(args, "shapes_file", None)) else None),
                         "dtype": args.dtype, "layout": args.layout, "engine": opts["engine"],
                         "directions": [SHORT[d] for d in directions],
                         "batch": args.batch, "layers": len(layers),
                         "tuning_db": opts["use_db"], "fresh": opts["fresh"]},
            "tuning_db": tuning_db.path()}


def _header(meta: dict[str, Any]) -> str:
    d, s = meta["device"], meta["settings"]
    cc = ".".join(map(str, d.get("compute_capability", [])))
    torch = f"torch {meta['torch']}" if meta.get("torch") else f"no torch column ({meta['torch_skipped']})"
    return (f"pycudnn {meta['pycudnn']}, cuDNN {meta['cudnn']}, GPU {d.get('index')}: {d.get('name')} "
            f"(cc {cc}, {d.get('sm_count')} SMs); {s['dtype']} {s['layout'].upper()}, engine "
            f"{s['engine']}, {s['layers']} layers x {'/'.join(s['directions'])}; {torch}")


def _bench_table(rows: list[dict[str, Any]], torch_on: bool, candidates: bool) -> str:
    headers = ["layer", "dir", "ms", "TFLOP/s"]
    if torch_on:
        headers += ["torch ms", "torch TFLOP/s", "torch/pycudnn"]
    headers += ["choice", "workspace", "source", "1st call ms"]
    body = []
    for r in rows:
        line = [r["layer"], SHORT[r["direction"]], _fmt(r["ms"], 4), _fmt(r["tflops"], 1)]
        if torch_on:
            line += [_fmt(r["torch_ms"], 4), _fmt(r["torch_tflops"], 1), _fmt(r["torch_over_pycudnn"], 2)]
        choice = r["choice"] or "-"
        if r["error"]:
            choice = "ERROR " + r["error"]
        line += [choice, _fmt_bytes(r["workspace"]), r["source"] or "-", _fmt(r["first_call_ms"], 1)]
        body.append(line)
    right = {2, 3} | ({4, 5, 6} if torch_on else set())
    right.add(len(headers) - 1)
    text = _table(headers, body, right)
    if candidates:
        parts = [text]
        for r in rows:
            cands = r.get("candidates")
            if not cands:
                continue
            parts.append(f"\n{r['layer']} {SHORT[r['direction']]}: {len(cands)} candidates")
            parts.append(_table(["#", "choice", "ms", "workspace", "notes"], [
                [i + 1, c["choice"], _fmt(c["time_ms"], 4) if c["time_ms"] is not None else "untimed",
                 _fmt_bytes(c["workspace"]), ",".join(c["notes"])] for i, c in enumerate(cands)],
                {0, 2}))
        text = "\n".join(parts)
    return text


def _summary(rows: list[dict[str, Any]], meta: dict[str, Any], torch_on: bool) -> str:
    ok = [r for r in rows if r["ms"]]
    lines = []
    if ok:
        total = sum(r["ms"] for r in ok)
        lines.append(f"\n{len(ok)} measurements, {total:.3f} ms in all (sum of per-call times)")
    ratios = [r["torch_over_pycudnn"] for r in rows if r.get("torch_over_pycudnn")]
    if torch_on and ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines.append(f"torch/pycudnn geometric mean {geo:.3f} (above 1: pycudnn is faster)")
    if meta.get("tuning_db_entries") is not None:
        lines.append(f"tuning database: {meta['tuning_db']} ({meta['tuning_db_entries']} records)")
    return "\n".join(lines)


_CSV_FIELDS = [f for f in ROW_FIELDS if f != "choice_detail"]


def _write_csv(file: str, rows: list[dict[str, Any]]) -> None:
    with open(file, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=_CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, shape=r["shape"]["shape"]))


def _plot(file: str, rows: list[dict[str, Any]], meta: dict[str, Any], torch_on: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['layer']} {SHORT[r['direction']]}" for r in rows]
    ours = [r["tflops"] or 0.0 for r in rows]
    theirs = [r["torch_tflops"] or 0.0 for r in rows]
    width = 0.4 if torch_on else 0.8
    fig, ax = plt.subplots(figsize=(max(8.0, 0.35 * len(rows) + 2), 5))
    xs = range(len(rows))
    ax.bar([x - (width / 2 if torch_on else 0) for x in xs], ours, width, label="pycudnn")
    if torch_on:
        ax.bar([x + width / 2 for x in xs], theirs, width, label=f"torch {meta.get('torch')}")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=75, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s")
    d, s = meta["device"], meta["settings"]
    ax.set_title(f"{d.get('name')}: {s['dtype']} {s['layout'].upper()}, engine {s['engine']}, "
                 f"cuDNN {meta['cudnn']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(file, dpi=120)
    plt.close(fig)


# ---- tune -----------------------------------------------------------------------------------------

def cmd_tune(args: argparse.Namespace) -> int:
    """Fill the tuning database: one measured search per layer and direction."""

    if not (args.model or args.shapes_file or args.shape):
        raise UsageError("say what to tune: --model NAME, --shapes-file FILE or --shape SHAPE")
    layers = layers_from_args(args)
    directions = _directions(args.direction)
    if not tuning_db.enabled():
        raise UsageError("the tuning database is turned off (PYCUDNN_TUNING_DB=0): nothing to fill")
    _require_gpu("tune", args.device)
    opts = options_from_args(args)
    before = len(tuning_db.entries())
    rows = _run_all(layers, directions, opts, args.device, False, args.quiet, "tune", False)
    searched = sum(1 for r in rows if r["searches"])
    reused = sum(1 for r in rows if r["source"] == "tuning-db")
    failed = [r for r in rows if r["error"]]
    after = len(tuning_db.entries())
    for r in failed:
        print(f"pycudnn tune: {r['layer']} {SHORT[r['direction']]}: {r['error']}", file=sys.stderr)
    print(f"tuned {len(layers)} layers x {len(directions)} directions: {searched} searched, "
          f"{reused} already in the database, {len(failed)} failed; "
          f"{tuning_db.path()} holds {after} records ({after - before:+d})")
    return 1 if failed else 0


# ---- cache ----------------------------------------------------------------------------------------

def terminal_safe(value: Any) -> str:
    """Text of an untrusted value fit for a terminal: non-printable characters (escape sequences,
    control and bidirectional-override characters) are written as Python escapes."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _entry_summary(e: dict[str, Any]) -> list[str]:
    """One row of ``cache show`` (every cell escaped: the entry may come from another machine;
    entries of another pycudnn's schema hold anything, so nothing here assumes a type)."""
    def obj(v: Any) -> dict[str, Any]:
        return v if isinstance(v, dict) else {}

    p, rec, gpu = obj(e.get("params")), obj(e.get("record")), obj(e.get("gpu"))
    cc = gpu.get("compute_capability", [])
    cc = ".".join(map(str, cc)) if isinstance(cc, list) else str(cc)
    choice = rec.get("tag") or (f"algo {rec['algo']} math {rec.get('math_type')}" if "algo" in rec else "?")
    ep = f"+{p['epilogue']}" if p.get("epilogue") else ""
    groups = p.get("groups", 1)
    layer = (f"x{p.get('input_shape')} w{p.get('weight_shape')} s{p.get('stride')} p{p.get('padding')}"
             f"{'' if groups == 1 else ' g' + str(groups)}")
    direction = p.get("direction")
    t = rec.get("time_ms")
    ms = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else -1.0
    version = e.get("cudnn_version")
    ws = rec.get("workspace")
    row = [f"{gpu.get('name')} ({cc}, {gpu.get('sm_count')} SMs)",
           _version_text(version) if type(version) is int else str(version), str(e.get("engine")),
           (SHORT.get(direction, direction) if isinstance(direction, str) else str(direction)) + ep,
           str(p.get("dtype")), str(p.get("weight_format")), layer, str(choice),
           _fmt(ms, 4) if ms >= 0 else "-",
           _fmt_bytes(ws) if type(ws) is int else "-", str(e.get("created", ""))]
    return [terminal_safe(c) for c in row]


_CACHE_COLUMNS = ["gpu", "cuDNN", "engine", "dir", "dtype", "fmt", "layer", "choice", "ms",
                  "workspace", "created"]


def _summaries(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The rows of ``cache show``; an entry that cannot be summarized (of another pycudnn's schema)
    shows as such instead of failing the listing."""
    out = []
    for e in rows:
        try:
            out.append(_entry_summary(e))
        except Exception as exc:  # noqa: BLE001 - one odd entry must not hide the others
            out.append([terminal_safe(f"(unreadable entry of schema {e.get('schema')!r}: "
                              f"{type(exc).__name__})")] + ["-"] * (len(_CACHE_COLUMNS) - 1))
    return out


def cmd_cache(args: argparse.Namespace) -> int:
    """show [FILE] | clear | export FILE | import FILE [--replace]."""

    action = args.action
    try:
        with warnings.catch_warnings():  # a refusal is in the output or the error below
            warnings.filterwarnings("ignore", message=r"pycudnn tuning database .* refused: ",
                                    category=tuning_db.TuningDatabaseWarning)
            return _cache_action(args, tuning_db)
    except PermissionError as exc:  # the database was refused: another user's, or open to others
        raise RunError(f"pycudnn cache {action}: {terminal_safe(_first_line(exc))}") from None


def _cache_action(args: argparse.Namespace, tuning_db: Any) -> int:
    action = args.action
    if args.replace and action != "import":
        raise UsageError("--replace goes with cache import")
    if action == "show" and args.file:
        return _show_file(args, tuning_db)
    if action == "show":
        rows = tuning_db.entries()
        if args.json:  # json.dumps escapes every control and non-ASCII character
            print(json.dumps({"path": tuning_db.path(), "entries": rows}, indent=1))
            return 0
        why = tuning_db.refused()
        state = ("" if tuning_db.enabled() else " (turned off: PYCUDNN_TUNING_DB=0)") + (
            f" (refused: {why})" if why else "")
        print(terminal_safe(f"{tuning_db.path()}: {len(rows)} records{state}"))
        if rows:
            print(_table(_CACHE_COLUMNS, _summaries(rows), {8}))
        return 0
    if action == "clear":
        n = tuning_db.clear()
        print(terminal_safe(f"removed {n} records from {tuning_db.path()}"))
        return 0
    if not args.file:
        raise UsageError(f"cache {action} needs a FILE")
    if action == "export":
        _check_output_path("cache export", args.file)
        n = tuning_db.export(args.file)
        print(f"exported {n} records to {terminal_safe(args.file)}")
        return 0
    # import
    if not os.path.isfile(args.file):
        raise UsageError(f"{terminal_safe(args.file)} does not exist")
    try:
        with warnings.catch_warnings():  # the count is printed below
            warnings.filterwarnings("ignore", message=r".*: refused \d+ entr",
                                    category=tuning_db.TuningDatabaseWarning)
            report = tuning_db.import_file(args.file, prefer="imported" if args.replace else "local")
    except ValueError as exc:
        raise UsageError(terminal_safe(_first_line(exc))) from None
    notes = []
    refused = (f"refused {report.refused} entr{'y' if report.refused == 1 else 'ies'} that did "
               f"not validate")
    if not (report.merged or report.kept):  # nothing valid in it: no merge, no write
        print(terminal_safe(f"{args.file} holds no records; {tuning_db.path()} is unchanged"
                    + (f"; {refused}" if report.refused else "")))
        return 0
    if report.kept:
        notes.append(f"kept {report.kept} local record{'s' if report.kept != 1 else ''} "
                     + ("unchanged" if args.replace else "(--replace replaces them)"))
    if report.refused:
        notes.append(refused)
    print(terminal_safe(f"merged {report.merged} records from {args.file} into {tuning_db.path()}"
                + "".join(f"; {n}" for n in notes)))
    return 0


def _show_file(args: argparse.Namespace, tuning_db: Any) -> int:
    """``cache show FILE``: the valid entries of FILE (an export, say), read as an import reads
    it; nothing is changed. Entries that do not validate are left out (stderr names them)."""
    if not os.path.lexists(args.file):
        raise UsageError(f"{terminal_safe(args.file)} does not exist")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", tuning_db.TuningDatabaseWarning)
            rows = tuning_db.read_file(args.file)
    except (ValueError, FileNotFoundError) as exc:
        raise UsageError(terminal_safe(_first_line(exc))) from None
    if args.json:  # json.dumps escapes every control and non-ASCII character
        print(json.dumps({"path": args.file, "entries": rows}, indent=1))
    else:
        print(terminal_safe(f"{args.file}: {len(rows)} records"))
        if rows:
            print(_table(_CACHE_COLUMNS, _summaries(rows), {8}))
    for w in caught:  # how many entries were left out, after the listing
        print(f"pycudnn cache show: {terminal_safe(w.message)}", file=sys.stderr)
    return 0


# ---- the parser -----------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse that reports a mistake as one line (UsageError) instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        raise _ParseError(f"{self.prog}: error: {message} (see '{self.prog} --help')")


def _layer_options(p: argparse.ArgumentParser, default_direction: str) -> None:
    p.add_argument("--model", choices=sorted(MODELS), help="built-in layer set (default: resnet50 "
                   "when no --shape is given); mobilenet = depthwise layers")
    p.add_argument("--shape", action="append", default=[], metavar="SHAPE",
                   help=f"a layer {SHAPE_FORMAT} (repeatable)")
    p.add_argument("--batch", type=_positive_int, help="batch size N for every layer (default: "
                   "the model's, 32; 2 for unet3d)")
    p.add_argument("--dtype", choices=list(DTYPES), default="bfloat16",
                   help="data type (default bfloat16); float32 is strict FP32, tf32 is float32 "
                        "data with TF32 tensor cores (pycudnn's and PyTorch's default)")
    p.add_argument("--layout", choices=["nhwc", "nchw"], default="nhwc",
                   help="memory format (default nhwc = channels_last)")
    p.add_argument("--direction", choices=[*DIRECTIONS, "all"], default=default_direction,
                   help=f"fwd, dgrad, wgrad or all (default {default_direction})")
    p.add_argument("--engine", choices=["graph", "v7"],
                   help="search engine (default: pycudnn.config.engine, graph unless PYCUDNN_ENGINE)")
    p.add_argument("--device", type=_nonneg_int, default=0, help="CUDA device (default 0)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {v}")
    return v


def _own_version() -> str:
    import pycudnn

    return pycudnn.__version__


def build_parser() -> argparse.ArgumentParser:
    """The ``pycudnn`` argument parser."""
    parser = _Parser(prog="pycudnn", description="pycudnn: cuDNN convolutions for any Python GPU "
                     "stack. Start with `pycudnn info`, then `pycudnn bench` on a GPU.")
    parser.add_argument("--version", action="version", version=f"pycudnn {_own_version()}",
                        help="print pycudnn's version and exit (`pycudnn info` shows cuDNN's)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log pycudnn's choices (-v: info, -vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("info", help="versions, libcudnn, devices, tuning database (no GPU needed)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("bench", help="time convolution layers (default: ResNet-50, bf16 NHWC)",
                       description="Time convolution layers with benchmark=True: the built-in "
                       "ResNet-50 layer set in bf16 NHWC on device 0 unless told otherwise, "
                       "against PyTorch's cuDNN path (torch.backends.cudnn.benchmark=True, same "
                       "data) when PyTorch is installed. Times are per call, CUDA events around "
                       "back-to-back calls, median of 7 trials. The choices go to the tuning "
                       "database.")
    _layer_options(p, "fwd")
    p.add_argument("--all-candidates", action="store_true",
                   help="search again and list every algorithm or plan with its time, workspace "
                        "and notes, not just the winner")
    p.add_argument("--fresh", action="store_true",
                   help="search again instead of reusing the tuning database (the new choice is stored)")
    p.add_argument("--no-tuning-db", action="store_true", help="neither read nor write the tuning database")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch column")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--csv", metavar="FILE", help="write the results as CSV")
    p.add_argument("--plot", metavar="FILE.png", help="draw TFLOP/s per layer (needs matplotlib)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("tune", help="fill the tuning database for a list of layers ahead of time",
                       description="Run a measured search (benchmark=True) for each layer and "
                       "direction so that later processes start without searching. The records "
                       "match programs that use the same dtype, layout, engine and flags.")
    _layer_options(p, "all")
    p.add_argument("--shapes-file", metavar="FILE",
                   help=f"one {SHAPE_FORMAT} per line ('#' starts a comment)")
    p.add_argument("--fresh", action="store_true",
                   help="search again even where the database already has a record")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("cache", help="show, clear, export or import the tuning database",
                       description="Show, clear, export or import the tuning database. An import "
                       "checks every entry (those that do not validate are refused and counted) "
                       "and only adds records for keys this database lacks: a record measured "
                       "here is never replaced by one from elsewhere unless --replace is given.")
    p.add_argument("action", choices=["show", "clear", "export", "import"])
    p.add_argument("file", nargs="?", help="show: list this file's records instead of the "
                   "database's; export: the file to write; import: the file to merge")
    p.add_argument("--json", action="store_true", help="show: print the entries as JSON")
    p.add_argument("--replace", action="store_true",
                   help="import: imported records replace local ones for the same key (default: "
                        "local records win)")
    p.set_defaults(func=cmd_cache)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failed or cannot run here, 2 usage)."""
    parser = build_parser()
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    command = "pycudnn"
    try:
        args = parser.parse_args(argv)
        debug = args.debug
        if not args.command:  # asked for nothing: say what there is
            parser.print_help(sys.stdout)
            return 0
        command = f"pycudnn {args.command}"
        if args.verbose:
            import logging

            logging.basicConfig(format="%(name)s: %(message)s", stream=sys.stderr)
            logging.getLogger("pycudnn").setLevel(logging.DEBUG if args.verbose > 1 else logging.INFO)
        return int(args.func(args) or 0)
    except _ParseError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 2
    except RunError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback; --debug shows it
        if debug:
            raise
        print(f"{command}: {type(exc).__name__}: {_first_line(exc)} (run with --debug for the "
              f"traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
