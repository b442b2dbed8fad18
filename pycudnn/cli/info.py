"""``pycudnn info``: versions, where libcudnn came from, devices, the tuning database (no GPU
needed; status 1 when libcudnn cannot load)."""

from __future__ import annotations

import argparse
import json
import os
import warnings
from typing import Any

from ..errors import CudnnNotFoundError, TuningDatabaseWarning
from ..ffi import library as _lib
from ..runtime.memory.devices import driver_version
from ..tuning import db as tuning_db
from ..tuning import routes as route_store
from .environment import cuda_mismatches, cuda_text, dist_version, list_devices, version_text
from .report import format_bytes, terminal_safe


def _bindings_runtime() -> str | None:
    """The CUDA version of the runtime cuda-bindings loads (for the mismatch warnings), or None
    where cuda-bindings is absent or broken."""
    try:
        from cuda.bindings import runtime as rt

        err, rtv = rt.cudaRuntimeGetVersion()
        return cuda_text(rtv) if not int(err) else None
    except Exception:  # noqa: BLE001 - cuda.bindings itself broken
        return None


def cmd_info(args: argparse.Namespace) -> int:
    """Versions, libcudnn, devices and the tuning database; works without a GPU or libcudnn, and
    exits with status 1 (after the report) when libcudnn cannot load."""
    import platform

    import pycudnn

    info: dict[str, Any] = {"pycudnn": pycudnn.__version__,
                            "pycudnn_path": os.path.dirname(os.path.abspath(pycudnn.__file__)),
                            "python": platform.python_version()}
    try:
        library = _lib.lib()
        info["cudnn"] = {"version": version_text(_lib.version()), "path": library.path,
                         "found_via": library.found_via,
                         "cuda_runtime": cuda_text(_lib.cudart_version())}
    except CudnnNotFoundError as exc:
        info["cudnn"] = {"error": "not found", "install": _lib.INSTALL_HINT,
                         "tried": [line.strip()[2:] for line in str(exc).splitlines()
                                   if line.startswith("  - ")]}
    drv = driver_version()
    info["cuda_driver"] = cuda_text(drv) if drv else None
    info["cuda_python_runtime"] = _bindings_runtime()
    devices, reason = list_devices()
    info["devices"] = devices
    info["no_gpu_reason"] = reason
    db: dict[str, Any] = {"path": tuning_db.path(), "enabled": tuning_db.enabled()}
    try:
        with warnings.catch_warnings(record=True) as caught:  # shown in the report below
            warnings.simplefilter("always", TuningDatabaseWarning)
            db["entries"] = len(tuning_db.entries(set_aside=False))  # info changes nothing
            routes = route_store.entries(set_aside=False)
            db["routes"] = {"path": route_store.path(), "entries": len(routes),
                            "to_torch": sum(r["winner"] == "torch" for r in routes)}
        if caught:
            db["warnings"] = [str(w.message) for w in caught]
    except OSError as exc:
        db["error"] = str(exc)
    info["tuning_db"] = db
    info["packages"] = {name: dist_version(name) for name in (
        "cuda-python", "cuda-bindings", "cuda-core", "cuda-pathfinder", "numpy", "ml_dtypes",
        "nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "torch", "cupy-cuda12x", "cupy-cuda13x")}
    info["cuda_mismatch"] = cuda_mismatches(info)

    # a machine where libcudnn cannot load cannot run pycudnn: the report, then status 1
    status = 1 if "error" in info["cudnn"] else 0
    if args.json:
        print(json.dumps(info, indent=2))
        return status
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
                           f"{d['sm_count']} SMs, {format_bytes(d['memory_bytes'])}")
    else:
        out.append(f"GPU          no GPU: {reason}")
    state = "" if db["enabled"] else " [disabled: PYCUDNN_TUNING_DB=0 or config.tuning_db=False]"
    count = f"{db['entries']} records" if "entries" in db else f"unreadable: {db.get('error')}"
    out.append(f"tuning DB    {db['path']} ({count}){state}")
    decided = db.get("routes")
    if decided and decided["entries"]:
        out.append(f"routing      {decided['path']} ({decided['entries']} decisions of "
                   f"pycudnn.torch, {decided['to_torch']} to PyTorch's convolution: "
                   f"pycudnn cache show lists them)")
    out.extend(f"warning      {terminal_safe(w)}" for w in db.get("warnings", ()))
    pk = ", ".join(f"{k} {v}" for k, v in info["packages"].items() if v)
    out.append(f"packages     {pk}")
    print("\n".join(out))
    return status
