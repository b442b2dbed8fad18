"""The C functions of cuDNN's legacy operations (activation, softmax, pooling) that pycudnn binds.

`PROTOTYPES` has the row format of `pycudnn._lib.PROTOTYPES` (name: (restype, argtypes), the C
signature from ``cudnn_ops_v9.h`` in the comment above each row). `register()` adds the rows to
that table, through which every C function is bound on first use; the operations call it before
their first C call (not at import, so that importing them leaves the table as ``library.py``
writes it until the rows move there).
"""

from __future__ import annotations

from ctypes import POINTER, c_double, c_int, c_void_p

from pycudnn.ffi import library as _lib

__all__ = ["PROTOTYPES", "register"]

_p = c_void_p          # any handle, descriptor or device pointer
_pi = POINTER(c_int)

# name: (restype, argtypes)   C signature in the comment above each row.
PROTOTYPES: dict[str, tuple[object, tuple]] = {
    # --- activation ------------------------------------------------------------------------------
    # cudnnStatus_t cudnnActivationBackward(cudnnHandle_t handle,
    #     cudnnActivationDescriptor_t activationDesc, const void *alpha,
    #     const cudnnTensorDescriptor_t yDesc, const void *y, const cudnnTensorDescriptor_t dyDesc,
    #     const void *dy, const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    #     const cudnnTensorDescriptor_t dxDesc, void *dx)
    "cudnnActivationBackward": (c_int, (_p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p)),
    # cudnnStatus_t cudnnSetActivationDescriptorSwishBeta(cudnnActivationDescriptor_t activationDesc,
    #     double swish_beta)
    "cudnnSetActivationDescriptorSwishBeta": (c_int, (_p, c_double)),
    # cudnnStatus_t cudnnGetActivationDescriptorSwishBeta(cudnnActivationDescriptor_t activationDesc,
    #     double *swish_beta)
    "cudnnGetActivationDescriptorSwishBeta": (c_int, (_p, POINTER(c_double))),
    # --- softmax ---------------------------------------------------------------------------------
    # cudnnStatus_t cudnnSoftmaxForward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algo,
    #     cudnnSoftmaxMode_t mode, const void *alpha, const cudnnTensorDescriptor_t xDesc,
    #     const void *x, const void *beta, const cudnnTensorDescriptor_t yDesc, void *y)
    "cudnnSoftmaxForward": (c_int, (_p, c_int, c_int, _p, _p, _p, _p, _p, _p)),
    # cudnnStatus_t cudnnSoftmaxBackward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algo,
    #     cudnnSoftmaxMode_t mode, const void *alpha, const cudnnTensorDescriptor_t yDesc,
    #     const void *y, const cudnnTensorDescriptor_t dyDesc, const void *dy, const void *beta,
    #     const cudnnTensorDescriptor_t dxDesc, void *dx)
    "cudnnSoftmaxBackward": (c_int, (_p, c_int, c_int, _p, _p, _p, _p, _p, _p, _p, _p)),
    # --- pooling ---------------------------------------------------------------------------------
    # cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t *poolingDesc)
    "cudnnCreatePoolingDescriptor": (c_int, (POINTER(c_void_p),)),
    # cudnnStatus_t cudnnSetPoolingNdDescriptor(cudnnPoolingDescriptor_t poolingDesc,
    #     const cudnnPoolingMode_t mode, const cudnnNanPropagation_t maxpoolingNanOpt, int nbDims,
    #     const int windowDimA[], const int paddingA[], const int strideA[])
    "cudnnSetPoolingNdDescriptor": (c_int, (_p, c_int, c_int, c_int, _pi, _pi, _pi)),
    # cudnnStatus_t cudnnGetPoolingNdDescriptor(const cudnnPoolingDescriptor_t poolingDesc,
    #     int nbDimsRequested, cudnnPoolingMode_t *mode, cudnnNanPropagation_t *maxpoolingNanOpt,
    #     int *nbDims, int windowDimA[], int paddingA[], int strideA[])
    "cudnnGetPoolingNdDescriptor": (c_int, (_p, c_int, _pi, _pi, _pi, _pi, _pi, _pi)),
    # cudnnStatus_t cudnnGetPoolingNdForwardOutputDim(const cudnnPoolingDescriptor_t poolingDesc,
    #     const cudnnTensorDescriptor_t inputTensorDesc, int nbDims, int outputTensorDimA[])
    "cudnnGetPoolingNdForwardOutputDim": (c_int, (_p, _p, c_int, _pi)),
    # cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t poolingDesc)
    "cudnnDestroyPoolingDescriptor": (c_int, (_p,)),
    # cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle,
    #     const cudnnPoolingDescriptor_t poolingDesc, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    #     const cudnnTensorDescriptor_t yDesc, void *y)
    "cudnnPoolingForward": (c_int, (_p, _p, _p, _p, _p, _p, _p, _p)),
    # cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t handle,
    #     const cudnnPoolingDescriptor_t poolingDesc, const void *alpha,
    #     const cudnnTensorDescriptor_t yDesc, const void *y, const cudnnTensorDescriptor_t dyDesc,
    #     const void *dy, const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    #     const cudnnTensorDescriptor_t dxDesc, void *dx)
    "cudnnPoolingBackward": (c_int, (_p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p)),
}

_registered = False


def register() -> None:
    """Add `PROTOTYPES` to pycudnn's prototype table (once; cheap afterwards)."""
    global _registered
    if not _registered:
        _lib.PROTOTYPES.update(PROTOTYPES)
        _registered = True
