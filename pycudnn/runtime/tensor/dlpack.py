"""DLPack's C structures (``dlpack.h``, legacy and versioned) and the capsule functions, through
ctypes; shared by the import (``as_tensor``) and the export (``Tensor.__dlpack__``).
"""

from __future__ import annotations

import ctypes
from ctypes import c_char_p, c_int, c_int32, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p
from typing import Any

from .geometry import type_name

# DLPack
kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13
kDLFloat, kDLBfloat = 2, 4
DL_CODES = {"float32": (kDLFloat, 32), "float16": (kDLFloat, 16), "float64": (kDLFloat, 64),
             "bfloat16": (kDLBfloat, 16)}
DL_DEVICE_NAMES = {1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan",
                    8: "kDLMetal", 9: "kDLVPI", 10: "kDLROCM", 11: "kDLROCMHost", 12: "kDLExtDev",
                    13: "kDLCUDAManaged", 14: "kDLOneAPI"}


# DLPack C structures (dlpack.h, versions 0.x legacy and 1.x versioned)
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("device", _DLDevice), ("ndim", c_int32), ("dtype", _DLDataType),
                ("shape", c_void_p), ("strides", c_void_p), ("byte_offset", c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", c_void_p), ("deleter", c_void_p),
                ("flags", c_uint64), ("dl_tensor", _DLTensor)]


_capi = ctypes.pythonapi
PyCapsule_IsValid = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, c_char_p)(("PyCapsule_IsValid", _capi))
PyCapsule_GetPointer = ctypes.PYFUNCTYPE(c_void_p, ctypes.py_object, c_char_p)(
    ("PyCapsule_GetPointer", _capi))
PyCapsule_SetName = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, c_char_p)(("PyCapsule_SetName", _capi))
_DELETER = ctypes.PYFUNCTYPE(None, c_void_p)  # producers' deleters, called with the GIL held
DLTENSOR = b"dltensor"
DLTENSOR_VERSIONED = b"dltensor_versioned"
USED_DLTENSOR = b"used_dltensor"
USED_DLTENSOR_VERSIONED = b"used_dltensor_versioned"
DLPACK_FLAG_BITMASK_READ_ONLY = 1 << 0  # dlpack.h, versioned capsules only


def dlpack_managed(capsule: Any) -> Any:
    """The structure an unconsumed DLPack capsule points at, as a ctypes structure over the
    producer's memory: ``DLManagedTensorVersioned`` (fields ``version``, ``flags``, ``dl_tensor``,
    ...) for a ``"dltensor_versioned"`` capsule, ``DLManagedTensor`` (``dl_tensor``, ...) for a
    legacy ``"dltensor"`` one, with the field names of ``dlpack.h``. Reading it copies nothing;
    writing a field changes what the consumer of the capsule will read.

    Raises:
        TypeError: ``capsule`` is not an unconsumed DLPack capsule.
    """
    if PyCapsule_IsValid(capsule, DLTENSOR_VERSIONED):
        return DLManagedTensorVersioned.from_address(PyCapsule_GetPointer(capsule, DLTENSOR_VERSIONED))
    if PyCapsule_IsValid(capsule, DLTENSOR):
        return DLManagedTensor.from_address(PyCapsule_GetPointer(capsule, DLTENSOR))
    raise TypeError(f"dlpack_managed: expected an unconsumed DLPack capsule, got {type_name(capsule)}")


def call_deleter(deleter: int, managed: int) -> None:
    _DELETER(deleter)(managed)
