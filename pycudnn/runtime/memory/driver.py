"""The CUDA driver API (``libcuda.so.1``, installed with every NVIDIA driver) through ctypes.

Every driver function the runtime layer calls is one row of `PROTOTYPES`: device count and the
current device (the runtime's primary context, as ``cudaSetDevice`` makes it current), stream-
ordered allocation, capture status, synchronisation, events, copies and the stream gate's host
word. No ``cuda.bindings`` module is imported for any of them (importing one costs ~110 ms).
`driver()` loads the library and binds every row once (False where it does not load, or lacks
a row: `problem` says why); hot paths read the loaded one as ``driver.loaded``. Loading calls
``cuInit(0)``; its status is ``init_status``.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, addressof, c_char_p, c_float, c_int, c_size_t, c_ubyte, c_uint
from ctypes import c_uint32, c_uint64, c_ulonglong, c_void_p
from typing import Any

__all__ = ["PROTOTYPES", "Driver", "driver", "LIBRARY"]

#: the driver library's soname
LIBRARY = "libcuda.so.1"

_p = c_void_p        # CUcontext, CUstream, CUevent, CUmemoryPool, CUgraph* and any out-pointer
_dptr = c_uint64     # CUdeviceptr

# name: (exported symbol, restype, argtypes). The C signature (cuda.h, CUDA 12.0+) is in the
# comment above each row; the symbol is the one cuda.h's macros name for that signature.
PROTOTYPES: dict[str, tuple[str, object, tuple]] = {
    # --- initialisation, errors ------------------------------------------------------------------
    # CUresult cuInit(unsigned int Flags)
    "cuInit": ("cuInit", c_int, (c_uint,)),
    # CUresult cuDriverGetVersion(int *driverVersion)
    "cuDriverGetVersion": ("cuDriverGetVersion", c_int, (_p,)),
    # CUresult cuGetErrorName(CUresult error, const char **pStr)
    "cuGetErrorName": ("cuGetErrorName", c_int, (c_int, POINTER(c_char_p))),
    # CUresult cuGetErrorString(CUresult error, const char **pStr)
    "cuGetErrorString": ("cuGetErrorString", c_int, (c_int, POINTER(c_char_p))),
    # --- devices and contexts --------------------------------------------------------------------
    # CUresult cuDeviceGetCount(int *count)
    "cuDeviceGetCount": ("cuDeviceGetCount", c_int, (_p,)),
    # CUresult cuDeviceGet(CUdevice *device, int ordinal)
    "cuDeviceGet": ("cuDeviceGet", c_int, (_p, c_int)),
    # CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
    "cuDeviceGetAttribute": ("cuDeviceGetAttribute", c_int, (_p, c_int, c_int)),
    # CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
    "cuDeviceGetName": ("cuDeviceGetName", c_int, (c_char_p, c_int, c_int)),
    # CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev)
    "cuDeviceTotalMem": ("cuDeviceTotalMem_v2", c_int, (_p, c_int)),
    # CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
    "cuDevicePrimaryCtxRetain": ("cuDevicePrimaryCtxRetain", c_int, (_p, c_int)),
    # CUresult cuCtxGetCurrent(CUcontext *pctx)
    "cuCtxGetCurrent": ("cuCtxGetCurrent", c_int, (_p,)),
    # CUresult cuCtxSetCurrent(CUcontext ctx)
    "cuCtxSetCurrent": ("cuCtxSetCurrent", c_int, (_p,)),
    # CUresult cuCtxGetDevice(CUdevice *device)
    "cuCtxGetDevice": ("cuCtxGetDevice", c_int, (_p,)),
    # CUresult cuCtxSynchronize(void)
    "cuCtxSynchronize": ("cuCtxSynchronize", c_int, ()),
    # --- memory ----------------------------------------------------------------------------------
    # CUresult cuMemGetInfo(size_t *free, size_t *total)
    "cuMemGetInfo": ("cuMemGetInfo_v2", c_int, (_p, _p)),
    # CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
    "cuMemAllocAsync": ("cuMemAllocAsync", c_int, (_p, c_size_t, _p)),
    # CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
    "cuMemFreeAsync": ("cuMemFreeAsync", c_int, (_dptr, _p)),
    # CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
    "cuMemAlloc": ("cuMemAlloc_v2", c_int, (_p, c_size_t)),
    # CUresult cuMemFree(CUdeviceptr dptr)
    "cuMemFree": ("cuMemFree_v2", c_int, (_dptr,)),
    # CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
    "cuDeviceGetMemPool": ("cuDeviceGetMemPool", c_int, (_p, c_int)),
    # CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
    "cuMemPoolSetAttribute": ("cuMemPoolSetAttribute", c_int, (_p, c_int, _p)),
    # CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
    "cuMemPoolGetAttribute": ("cuMemPoolGetAttribute", c_int, (_p, c_int, _p)),
    # CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
    "cuMemPoolTrimTo": ("cuMemPoolTrimTo", c_int, (_p, c_size_t)),
    # CUresult cuPointerGetAttributes(unsigned int numAttributes,
    #     CUpointer_attribute *attributes, void **data, CUdeviceptr ptr)
    "cuPointerGetAttributes": ("cuPointerGetAttributes", c_int, (c_uint, _p, _p, _dptr)),
    # CUresult cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
    #     CUstream hStream)
    "cuMemcpyHtoDAsync": ("cuMemcpyHtoDAsync_v2", c_int, (_dptr, _p, c_size_t, _p)),
    # CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
    #     CUstream hStream)
    "cuMemcpyDtoHAsync": ("cuMemcpyDtoHAsync_v2", c_int, (_p, _dptr, c_size_t, _p)),
    # CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
    "cuMemsetD8Async": ("cuMemsetD8Async", c_int, (_dptr, c_ubyte, c_size_t, _p)),
    # CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
    "cuMemHostAlloc": ("cuMemHostAlloc", c_int, (_p, c_size_t, c_uint)),
    # CUresult cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags)
    "cuMemHostGetDevicePointer": ("cuMemHostGetDevicePointer_v2", c_int, (_p, _p, c_uint)),
    # CUresult cuMemFreeHost(void *p)
    "cuMemFreeHost": ("cuMemFreeHost", c_int, (_p,)),
    # --- streams and capture ---------------------------------------------------------------------
    # CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
    "cuStreamCreate": ("cuStreamCreate", c_int, (_p, c_uint)),
    # CUresult cuStreamDestroy(CUstream hStream)
    "cuStreamDestroy": ("cuStreamDestroy_v2", c_int, (_p,)),
    # CUresult cuStreamSynchronize(CUstream hStream)
    "cuStreamSynchronize": ("cuStreamSynchronize", c_int, (_p,)),
    # CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
    "cuStreamWaitEvent": ("cuStreamWaitEvent", c_int, (_p, _p, c_uint)),
    # CUresult cuStreamGetId(CUstream hStream, unsigned long long *streamId)
    "cuStreamGetId": ("cuStreamGetId", c_int, (_p, _p)),
    # CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
    "cuStreamIsCapturing": ("cuStreamIsCapturing", c_int, (_p, _p)),
    # CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
    "cuThreadExchangeStreamCaptureMode": ("cuThreadExchangeStreamCaptureMode", c_int, (_p,)),
    # CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
    #     unsigned int flags)
    "cuStreamWaitValue32": ("cuStreamWaitValue32_v2", c_int, (_p, _dptr, c_uint32, c_uint)),
    # CUresult cuStreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode)
    "cuStreamBeginCapture": ("cuStreamBeginCapture_v2", c_int, (_p, c_int)),
    # CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
    "cuStreamEndCapture": ("cuStreamEndCapture", c_int, (_p, _p)),
    # --- CUDA graphs -----------------------------------------------------------------------------
    # CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
    "cuGraphGetNodes": ("cuGraphGetNodes", c_int, (_p, _p, _p)),
    # CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
    "cuGraphNodeGetType": ("cuGraphNodeGetType", c_int, (_p, _p)),
    # CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
    #     unsigned long long flags)
    "cuGraphInstantiateWithFlags": ("cuGraphInstantiateWithFlags", c_int, (_p, _p, c_ulonglong)),
    # CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
    "cuGraphLaunch": ("cuGraphLaunch", c_int, (_p, _p)),
    # CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
    "cuGraphExecDestroy": ("cuGraphExecDestroy", c_int, (_p,)),
    # CUresult cuGraphDestroy(CUgraph hGraph)
    "cuGraphDestroy": ("cuGraphDestroy", c_int, (_p,)),
    # --- events ----------------------------------------------------------------------------------
    # CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
    "cuEventCreate": ("cuEventCreate", c_int, (_p, c_uint)),
    # CUresult cuEventDestroy(CUevent hEvent)
    "cuEventDestroy": ("cuEventDestroy_v2", c_int, (_p,)),
    # CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
    "cuEventRecord": ("cuEventRecord", c_int, (_p, _p)),
    # CUresult cuEventQuery(CUevent hEvent)
    "cuEventQuery": ("cuEventQuery", c_int, (_p,)),
    # CUresult cuEventSynchronize(CUevent hEvent)
    "cuEventSynchronize": ("cuEventSynchronize", c_int, (_p,)),
    # CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
    "cuEventElapsedTime": ("cuEventElapsedTime", c_int, (POINTER(c_float), _p, _p)),
}

# enum values of cuda.h used by the runtime layer
CAPTURE_MODE_THREAD_LOCAL = 1     # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
CAPTURE_MODE_RELAXED = 2          # CU_STREAM_CAPTURE_MODE_RELAXED
GRAPH_NODE_KERNEL = 0             # CU_GRAPH_NODE_TYPE_KERNEL
GRAPH_NODE_MEMSET = 2             # CU_GRAPH_NODE_TYPE_MEMSET
GRAPH_NODE_EMPTY = 5              # CU_GRAPH_NODE_TYPE_EMPTY
EVENT_DISABLE_TIMING = 2          # CU_EVENT_DISABLE_TIMING
STREAM_NON_BLOCKING = 1           # CU_STREAM_NON_BLOCKING
STREAM_WAIT_VALUE_GEQ = 0         # CU_STREAM_WAIT_VALUE_GEQ
MEMHOSTALLOC_PORTABLE = 1         # CU_MEMHOSTALLOC_PORTABLE
MEMHOSTALLOC_DEVICEMAP = 2        # CU_MEMHOSTALLOC_DEVICEMAP
POINTER_MEMORY_TYPE = 2           # CU_POINTER_ATTRIBUTE_MEMORY_TYPE
POINTER_DEVICE_ORDINAL = 9        # CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
MEMPOOL_RELEASE_THRESHOLD = 4     # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
MEMPOOL_USED_MEM_CURRENT = 7      # CU_MEMPOOL_ATTR_USED_MEM_CURRENT
ATTR_MULTIPROCESSOR_COUNT = 16    # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
ATTR_CC_MAJOR = 75                # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
ATTR_CC_MINOR = 76                # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
ATTR_MEMORY_POOLS_SUPPORTED = 115  # CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
NOT_READY = 600                   # CUDA_ERROR_NOT_READY


class Driver:
    """The loaded driver library: every row of `PROTOTYPES` bound as an attribute of its name.

    ``free`` is ``cuMemFreeAsync`` and ``stream_id`` ``cuStreamGetId`` (the hot paths' names);
    `allocate()` is the hot path's ``cuMemAllocAsync``. ``init_status`` is what ``cuInit(0)``
    returned (0: the driver found a usable device).
    """

    def __init__(self, cdll: Any) -> None:
        self._cdll = cdll
        for name, (symbol, restype, argtypes) in PROTOTYPES.items():
            fn = getattr(cdll, symbol)  # AttributeError: the driver is older than the table
            fn.restype = restype
            fn.argtypes = list(argtypes)
            setattr(self, name, fn)
        self.alloc = self.cuMemAllocAsync
        self.free = self.cuMemFreeAsync
        self.stream_id = self.cuStreamGetId
        self.init_status = int(self.cuInit(0))

    def __getattr__(self, name: str) -> Any:
        # reached only for names no row bound
        raise AttributeError(f"{name!r} is not in pycudnn's CUDA driver prototype table")

    def allocate(self, nbytes: int, stream: int) -> int:
        """A device pointer from ``cuMemAllocAsync``, or 0 when the driver refused (the caller
        takes the careful path)."""
        # an out-parameter per call: no lock, and safe when a finalizer or a signal handler
        # allocates on this thread between the call and the read; its address (an int) converts
        # faster than a byref
        out = c_uint64()
        if self.alloc(addressof(out), nbytes, stream):
            return 0
        return out.value

    def error_text(self, code: int) -> str:
        """``"CUDA_ERROR_NAME: description"`` for a ``CUresult``."""
        name, desc = c_char_p(), c_char_p()
        if self.cuGetErrorName(code, ctypes.byref(name)) or not name.value:
            return f"CUresult {code}"
        self.cuGetErrorString(code, ctypes.byref(desc))
        text = name.value.decode(errors="replace")
        return f"{text}: {desc.value.decode(errors='replace')}" if desc.value else text


loaded: Any = None  # a Driver once loaded, False where libcuda cannot be; None: not tried
#: why the driver could not be loaded (None when it was, or was not tried yet)
problem: str | None = None


def driver() -> Any:
    """The loaded `Driver`, or False where ``libcuda.so.1`` does not load or lacks a function of
    `PROTOTYPES` (`problem` then says which)."""
    global loaded, problem
    if loaded is None:
        try:
            cdll = ctypes.CDLL(LIBRARY)
        except OSError as exc:
            problem = f"{LIBRARY} does not load: {exc}"
            loaded = False
            return loaded
        try:
            loaded = Driver(cdll)
        except AttributeError as exc:
            problem = (f"the NVIDIA driver is too old: {LIBRARY} lacks a function pycudnn calls "
                       f"({exc}); install a driver for CUDA 12.0 or newer")
            loaded = False
    return loaded
