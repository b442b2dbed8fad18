"""What the machine offers: packages and their versions, libcudnn, CUDA driver and runtime, the
GPUs; the CUDA mismatch warnings and the check that a command has a GPU to run on.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import CudnnNotFoundError, PycudnnError
from ..ffi import library as _lib
from ..runtime.memory import device_count, device_identity, no_device_reason
from ..runtime.memory.devices import device_total_memory
from .errors import RunError, UsageError


def dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:  # noqa: BLE001 - not installed
        return None


def require_gpu(command: str, device: int = 0) -> None:
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


def list_devices() -> tuple[list[dict[str, Any]], str | None]:
    """(devices, None) or ([], why there is none); asked of the driver, which makes no context."""
    reason = no_device_reason()
    if reason is not None:
        return [], reason
    out: list[dict[str, Any]] = []
    for i in range(device_count()):
        try:
            out.append({"index": i, **device_identity(i), "memory_bytes": device_total_memory(i)})
        except PycudnnError as exc:
            out.append({"index": i, "error": str(exc)})
    return out, None


def version_text(v: int) -> str:
    return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"


def cuda_text(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


#: what the ``cu12`` / ``cu13`` extras require, where the installed metadata cannot say
_EXTRAS = {"cu12": ("nvidia-cudnn-cu12>=9,<10", "cuda-python>=12.6,<13"),
           "cu13": ("nvidia-cudnn-cu13>=9,<10", "cuda-python>=13,<14")}


def extra_requirements(extra: str) -> list[str]:
    """The requirements pycudnn's ``extra`` adds, from the installed package's metadata (else
    the known ``cu12`` / ``cu13`` lists)."""
    from importlib import metadata

    try:
        reqs = metadata.requires("pycudnn-ctypes") or []
    except metadata.PackageNotFoundError:
        reqs = []
    marker = f'extra == "{extra}"'
    found = [r.split(";")[0].strip() for r in reqs if marker in r]
    return found or list(_EXTRAS.get(extra, ()))


def pip_install_command(extra: str) -> str:
    """The command that installs what pycudnn's ``extra`` brings: this checkout with the extra
    when pycudnn runs from one, else the extra's own requirements (nothing of pycudnn's is on
    a package index yet, so ``pycudnn-ctypes[extra]`` would not resolve)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # pycudnn/cli/..
    if os.path.isfile(os.path.join(root, "pyproject.toml")):
        return f'pip install -e "{root}[{extra}]"'
    reqs = extra_requirements(extra)
    if not reqs:
        raise ValueError(f"pip_install_command: unknown extra {extra!r}")
    return "pip install " + " ".join(f'"{r}"' for r in reqs)


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
