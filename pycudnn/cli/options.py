"""The options ``bench`` and ``tune`` share (``--model``, ``--shape``, ``--dtype``, ``--layout``,
``--direction``, ...) and what they ask of each measurement (`options_from_args`).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..configuration import config
from ..tuning import db as tuning_db
from .models import DIRECTIONS, MODELS, SHAPE_FORMAT

#: --dtype -> (pycudnn dtype, allow_tf32 to pass; None leaves pycudnn.config's)
DTYPES: dict[str, tuple[str, bool | None]] = {
    "bfloat16": ("bfloat16", None), "float16": ("float16", None), "tf32": ("float32", True),
    "float32": ("float32", False), "float64": ("float64", None),
}
#: the other usual spellings of a ``--dtype`` (PyTorch's, NumPy's, the short ones)
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
                 "float": "float32", "fp64": "float64", "double": "float64"}
#: ``--layout`` -> the memory format of the tensors
LAYOUTS = {"nhwc": "channels_last", "nchw": "contiguous"}


def dtype_name(text: str) -> str:
    """The `DTYPES` key ``--dtype`` names: any case, aliases (`DTYPE_ALIASES`) resolved; an
    unknown name is returned as given, lowercased, for argparse's choices to refuse."""
    name = text.strip().lower()
    return DTYPE_ALIASES.get(name, name)


def layout_name(text: str) -> str:
    """The `LAYOUTS` key ``--layout`` names (NHWC or NCHW, in any case)."""
    return text.strip().lower()


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
    fmt = LAYOUTS[args.layout]
    return {"dtype": dtype, "fmt": fmt, "engine": engine, "flags": fl, "use_db": use_db,
            "fresh": getattr(args, "fresh", False),
            "all_candidates": getattr(args, "all_candidates", False)}


def add_layer_options(p: argparse.ArgumentParser, default_direction: str,
                      default_model: bool = True) -> None:
    """The options of ``bench`` and ``tune`` that say which layers to run and how; without
    ``default_model`` (``tune``) the layers must be named."""
    when = ("default: resnet50 when no --shape is given" if default_model
            else "one of --model, --shape, --shapes-file is needed")
    p.add_argument("--model", choices=sorted(MODELS), help=f"built-in layer set ({when}); "
                   "mobilenet = depthwise layers")
    p.add_argument("--shape", action="append", default=[], metavar="SHAPE",
                   help=f"a layer {SHAPE_FORMAT} (repeatable)")
    p.add_argument("--batch", type=_positive_int, help="batch size N for every layer (default: "
                   "the model's, 32; 2 for unet3d)")
    p.add_argument("--dtype", type=dtype_name, choices=list(DTYPES), default="bfloat16",
                   help="data type (default bfloat16; also bf16, fp16/half, fp32, fp64, any case); "
                        "float32 is strict FP32, tf32 is float32 data with TF32 tensor cores "
                        "(pycudnn's and PyTorch's default)")
    p.add_argument("--layout", type=layout_name, choices=list(LAYOUTS), default="nhwc",
                   help="memory format (default nhwc = channels_last; NHWC or NCHW, any case)")
    p.add_argument("--direction", choices=[*DIRECTIONS, "all"], default=default_direction,
                   help=f"fwd, dgrad, wgrad or all (default {default_direction})")
    p.add_argument("--engine", choices=["graph", "v7"],
                   help="search engine (default: pycudnn.config.engine, graph unless PYCUDNN_ENGINE)")
    p.add_argument("--device", type=_nonneg_int, default=0, help="CUDA device (default 0)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
    return v


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def _nonneg_int(text: str) -> int:
    return _int_at_least(text, 0, "a non-negative integer")
