"""Finding and loading libcudnn lazily, the prototype table, and the status checker.

``import pycudnn`` never opens libcudnn: `lib()` does, on first use, trying in order the path in
``PYCUDNN_LIBRARY``, the NVIDIA cuDNN wheel's ``libcudnn.so.9`` (by its path),
``cuda.pathfinder.load_nvidia_dynamic_lib("cudnn")`` (NVIDIA wheels, conda, system), then the
sonames ``libcudnn.so.9`` and ``libcudnn.so``; if none loads,
`CudnnNotFoundError` lists every place tried and why. A non-empty ``PYCUDNN_LIBRARY`` is the only
place tried (a library it names that does not load, is not cuDNN or is older than 9.0 is an
error, never a fall-through to a cuDNN the user did not ask for), and it must be absolute: the
library opens at the first call that needs it, when the current directory may be another.

Every C function pycudnn calls is one row of `PROTOTYPES`, with explicit ``restype`` and
``argtypes`` (``c_void_p`` for handles and pointers, ``c_size_t`` for sizes: ctypes' default
``int`` restype would truncate 64-bit values). Rows are bound on first use and then cached as
attributes of the `Library` object, so a hot-path call is one attribute lookup.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from ctypes import (POINTER, c_char_p, c_double, c_float, c_int, c_int64, c_size_t, c_ulonglong,
                    c_void_p)
from typing import Any, Callable, Iterator, NoReturn

from .._types import Status
from ..errors import CudnnNotFoundError, error_class_for_status

__all__ = ["PROTOTYPES", "Library", "CheckedFunctions", "lib", "check", "raise_status", "version", "version_tuple",
           "library_path", "cudart_version", "is_loaded", "fresh_load", "status_name", "MIN_VERSION",
           "INSTALL_HINT"]

#: cuDNN 9.0.0 in cudnnGetVersion's encoding (major * 10000 + minor * 100 + patch)
MIN_VERSION = 90000

_p = c_void_p          # any handle, descriptor or device pointer
_pi = POINTER(c_int)
_pi64 = POINTER(c_int64)
_psz = POINTER(c_size_t)
_pp = POINTER(c_void_p)

# The three directions of a convolution (forward, backward data, backward filter) each have the
# same four functions with the same argument types, only the descriptors' roles differ:
#: handle, 4 descriptors, requested count, returned count, perf results
_GET_ALGORITHMS = (_p, _p, _p, _p, _p, c_int, _pi, _p)
#: handle, 3 descriptor and pointer pairs, output descriptor and pointer, requested count,
#: returned count, perf results, workspace and its size
_FIND_ALGORITHMS = (_p, _p, _p, _p, _p, _p, _p, _p, c_int, _pi, _p, _p, c_size_t)
#: handle, 4 descriptors, algorithm, the size written
_WORKSPACE_SIZE = (_p, _p, _p, _p, _p, c_int, _psz)
#: handle, alpha, 2 descriptor and pointer pairs, convolution descriptor, algorithm, workspace
#: and its size, beta, output descriptor and pointer
_CONVOLVE = (_p, _p, _p, _p, _p, _p, _p, c_int, _p, c_size_t, _p, _p, _p)

# name: (restype, argtypes)   C signature in the comment above each row.
PROTOTYPES: dict[str, tuple[object, tuple]] = {
    # --- library ---------------------------------------------------------------------------------
    # size_t cudnnGetVersion(void)
    "cudnnGetVersion": (c_size_t, ()),
    # size_t cudnnGetCudartVersion(void)
    "cudnnGetCudartVersion": (c_size_t, ()),
    # const char *cudnnGetErrorString(cudnnStatus_t status)
    "cudnnGetErrorString": (c_char_p, (c_int,)),
    # void cudnnGetLastErrorString(char *message, size_t max_size)
    "cudnnGetLastErrorString": (None, (c_char_p, c_size_t)),
    # cudnnStatus_t cudnnGetProperty(libraryPropertyType type, int *value)
    "cudnnGetProperty": (c_int, (c_int, _pi)),
    # --- handle ----------------------------------------------------------------------------------
    # cudnnStatus_t cudnnCreate(cudnnHandle_t *handle)
    "cudnnCreate": (c_int, (_pp,)),
    # cudnnStatus_t cudnnDestroy(cudnnHandle_t handle)
    "cudnnDestroy": (c_int, (_p,)),
    # cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId)
    "cudnnSetStream": (c_int, (_p, _p)),
    # cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *streamId)
    "cudnnGetStream": (c_int, (_p, _pp)),
    # --- tensor descriptor -----------------------------------------------------------------------
    # cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc)
    "cudnnCreateTensorDescriptor": (c_int, (_pp,)),
    # cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t tensorDesc,
    #     cudnnDataType_t dataType, int nbDims, const int dimA[], const int strideA[])
    "cudnnSetTensorNdDescriptor": (c_int, (_p, c_int, c_int, _pi, _pi)),
    # cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t tensorDesc,
    #     int nbDimsRequested, cudnnDataType_t *dataType, int *nbDims, int dimA[], int strideA[])
    "cudnnGetTensorNdDescriptor": (c_int, (_p, c_int, _pi, _pi, _pi, _pi)),
    # cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc)
    "cudnnDestroyTensorDescriptor": (c_int, (_p,)),
    # --- filter descriptor -----------------------------------------------------------------------
    # cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *filterDesc)
    "cudnnCreateFilterDescriptor": (c_int, (_pp,)),
    # cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t filterDesc,
    #     cudnnDataType_t dataType, cudnnTensorFormat_t format, int nbDims, const int filterDimA[])
    "cudnnSetFilterNdDescriptor": (c_int, (_p, c_int, c_int, c_int, _pi)),
    # cudnnStatus_t cudnnGetFilterNdDescriptor(const cudnnFilterDescriptor_t filterDesc,
    #     int nbDimsRequested, cudnnDataType_t *dataType, cudnnTensorFormat_t *format,
    #     int *nbDims, int filterDimA[])
    "cudnnGetFilterNdDescriptor": (c_int, (_p, c_int, _pi, _pi, _pi, _pi)),
    # cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc)
    "cudnnDestroyFilterDescriptor": (c_int, (_p,)),
    # --- convolution descriptor ------------------------------------------------------------------
    # cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *convDesc)
    "cudnnCreateConvolutionDescriptor": (c_int, (_pp,)),
    # cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t convDesc,
    #     int arrayLength, const int padA[], const int filterStrideA[], const int dilationA[],
    #     cudnnConvolutionMode_t mode, cudnnDataType_t computeType)
    "cudnnSetConvolutionNdDescriptor": (c_int, (_p, c_int, _pi, _pi, _pi, c_int, c_int)),
    # cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc, int groupCount)
    "cudnnSetConvolutionGroupCount": (c_int, (_p, c_int)),
    # cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc, cudnnMathType_t mathType)
    "cudnnSetConvolutionMathType": (c_int, (_p, c_int)),
    # cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc, cudnnMathType_t *mathType)
    "cudnnGetConvolutionMathType": (c_int, (_p, _pi)),
    # cudnnStatus_t cudnnGetConvolutionNdForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
    #     const cudnnTensorDescriptor_t inputTensorDesc, const cudnnFilterDescriptor_t filterDesc,
    #     int nbDims, int tensorOuputDimA[])
    "cudnnGetConvolutionNdForwardOutputDim": (c_int, (_p, _p, _p, c_int, _pi)),
    # cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc)
    "cudnnDestroyConvolutionDescriptor": (c_int, (_p,)),
    # cudnnStatus_t cudnnGetConvolutionNdDescriptor(const cudnnConvolutionDescriptor_t convDesc,
    #     int arrayLengthRequested, int *arrayLength, int padA[], int strideA[], int dilationA[],
    #     cudnnConvolutionMode_t *mode, cudnnDataType_t *computeType)
    "cudnnGetConvolutionNdDescriptor": (c_int, (_p, c_int, _pi, _pi, _pi, _pi, _pi, _pi)),
    # cudnnStatus_t cudnnGetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc, int *groupCount)
    "cudnnGetConvolutionGroupCount": (c_int, (_p, _pi)),
    # --- activation and op-tensor descriptors -----------------------------------------------------
    # cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t *activationDesc)
    "cudnnCreateActivationDescriptor": (c_int, (_pp,)),
    # cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t activationDesc,
    #     cudnnActivationMode_t mode, cudnnNanPropagation_t reluNanOpt, double coef)
    "cudnnSetActivationDescriptor": (c_int, (_p, c_int, c_int, c_double)),
    # cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t activationDesc)
    "cudnnDestroyActivationDescriptor": (c_int, (_p,)),
    # cudnnStatus_t cudnnGetActivationDescriptor(const cudnnActivationDescriptor_t activationDesc,
    #     cudnnActivationMode_t *mode, cudnnNanPropagation_t *reluNanOpt, double *coef)
    "cudnnGetActivationDescriptor": (c_int, (_p, _pi, _pi, POINTER(c_double))),
    # cudnnStatus_t cudnnCreateOpTensorDescriptor(cudnnOpTensorDescriptor_t *opTensorDesc)
    "cudnnCreateOpTensorDescriptor": (c_int, (_pp,)),
    # cudnnStatus_t cudnnSetOpTensorDescriptor(cudnnOpTensorDescriptor_t opTensorDesc,
    #     cudnnOpTensorOp_t opTensorOp, cudnnDataType_t opTensorCompType, cudnnNanPropagation_t opTensorNanOpt)
    "cudnnSetOpTensorDescriptor": (c_int, (_p, c_int, c_int, c_int)),
    # cudnnStatus_t cudnnDestroyOpTensorDescriptor(cudnnOpTensorDescriptor_t opTensorDesc)
    "cudnnDestroyOpTensorDescriptor": (c_int, (_p,)),
    # cudnnStatus_t cudnnGetOpTensorDescriptor(const cudnnOpTensorDescriptor_t opTensorDesc,
    #     cudnnOpTensorOp_t *opTensorOp, cudnnDataType_t *opTensorCompType,
    #     cudnnNanPropagation_t *opTensorNanOpt)
    "cudnnGetOpTensorDescriptor": (c_int, (_p, _pi, _pi, _pi)),
    # --- tensor operations -----------------------------------------------------------------------
    # cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void *alpha,
    #     const cudnnTensorDescriptor_t aDesc, const void *A, const void *beta,
    #     const cudnnTensorDescriptor_t cDesc, void *C)
    "cudnnAddTensor": (c_int, (_p, _p, _p, _p, _p, _p, _p)),
    # cudnnStatus_t cudnnScaleTensor(cudnnHandle_t handle, const cudnnTensorDescriptor_t yDesc,
    #     void *y, const void *alpha)
    "cudnnScaleTensor": (c_int, (_p, _p, _p, _p)),
    # cudnnStatus_t cudnnOpTensor(cudnnHandle_t handle, const cudnnOpTensorDescriptor_t opTensorDesc,
    #     const void *alpha1, const cudnnTensorDescriptor_t aDesc, const void *A,
    #     const void *alpha2, const cudnnTensorDescriptor_t bDesc, const void *B,
    #     const void *beta, const cudnnTensorDescriptor_t cDesc, void *C)
    "cudnnOpTensor": (c_int, (_p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p)),
    # cudnnStatus_t cudnnActivationForward(cudnnHandle_t handle, cudnnActivationDescriptor_t activationDesc,
    #     const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,
    #     const void *beta, const cudnnTensorDescriptor_t yDesc, void *y)
    "cudnnActivationForward": (c_int, (_p, _p, _p, _p, _p, _p, _p, _p)),
    # cudnnStatus_t cudnnSetTensor(cudnnHandle_t handle, const cudnnTensorDescriptor_t yDesc,
    #     void *y, const void *valuePtr)
    "cudnnSetTensor": (c_int, (_p, _p, _p, _p)),
    # cudnnStatus_t cudnnTransformTensor(cudnnHandle_t handle, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    #     const cudnnTensorDescriptor_t yDesc, void *y)
    "cudnnTransformTensor": (c_int, (_p, _p, _p, _p, _p, _p, _p)),
    # --- forward convolution ---------------------------------------------------------------------
    # cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int *count)
    "cudnnGetConvolutionForwardAlgorithmMaxCount": (c_int, (_p, _pi)),
    # cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t srcDesc, const cudnnFilterDescriptor_t filterDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t destDesc,
    #     const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionFwdAlgoPerf_t *perfResults)
    "cudnnGetConvolutionForwardAlgorithm_v7": (c_int, _GET_ALGORITHMS),
    # cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnFilterDescriptor_t wDesc,
    #     const void *w, const cudnnConvolutionDescriptor_t convDesc,
    #     const cudnnTensorDescriptor_t yDesc, void *y, const int requestedAlgoCount,
    #     int *returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t *perfResults,
    #     void *workSpace, size_t workSpaceSizeInBytes)
    "cudnnFindConvolutionForwardAlgorithmEx": (c_int, _FIND_ALGORITHMS),
    # cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
    #     cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes)
    "cudnnGetConvolutionForwardWorkspaceSize": (c_int, _WORKSPACE_SIZE),
    # cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnFilterDescriptor_t wDesc,
    #     const void *w, const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
    #     void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    #     const cudnnTensorDescriptor_t yDesc, void *y)
    "cudnnConvolutionForward": (c_int, _CONVOLVE),
    # cudnnStatus_t cudnnConvolutionBiasActivationForward(cudnnHandle_t handle, const void *alpha1,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnFilterDescriptor_t wDesc,
    #     const void *w, const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
    #     void *workSpace, size_t workSpaceSizeInBytes, const void *alpha2,
    #     const cudnnTensorDescriptor_t zDesc, const void *z, const cudnnTensorDescriptor_t biasDesc,
    #     const void *bias, const cudnnActivationDescriptor_t activationDesc,
    #     const cudnnTensorDescriptor_t yDesc, void *y)
    "cudnnConvolutionBiasActivationForward": (
        c_int, (_p, _p, _p, _p, _p, _p, _p, c_int, _p, c_size_t, _p, _p, _p, _p, _p, _p, _p, _p)),
    # --- backward data ---------------------------------------------------------------------------
    # cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t handle, int *count)
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount": (c_int, (_p, _pi)),
    # cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle,
    #     const cudnnFilterDescriptor_t filterDesc, const cudnnTensorDescriptor_t diffDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t gradDesc,
    #     const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionBwdDataAlgoPerf_t *perfResults)
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": (c_int, _GET_ALGORITHMS),
    # cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t handle,
    #     const cudnnFilterDescriptor_t wDesc, const void *w, const cudnnTensorDescriptor_t dyDesc,
    #     const void *dy, const cudnnConvolutionDescriptor_t convDesc,
    #     const cudnnTensorDescriptor_t dxDesc, void *dx, const int requestedAlgoCount,
    #     int *returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t *perfResults,
    #     void *workSpace, size_t workSpaceSizeInBytes)
    "cudnnFindConvolutionBackwardDataAlgorithmEx": (c_int, _FIND_ALGORITHMS),
    # cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle,
    #     const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    #     cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes)
    "cudnnGetConvolutionBackwardDataWorkspaceSize": (c_int, _WORKSPACE_SIZE),
    # cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
    #     const cudnnFilterDescriptor_t wDesc, const void *w, const cudnnTensorDescriptor_t dyDesc,
    #     const void *dy, const cudnnConvolutionDescriptor_t convDesc,
    #     cudnnConvolutionBwdDataAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes,
    #     const void *beta, const cudnnTensorDescriptor_t dxDesc, void *dx)
    "cudnnConvolutionBackwardData": (c_int, _CONVOLVE),
    # --- backward filter -------------------------------------------------------------------------
    # cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t handle, int *count)
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount": (c_int, (_p, _pi)),
    # cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t srcDesc, const cudnnTensorDescriptor_t diffDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    #     const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionBwdFilterAlgoPerf_t *perfResults)
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": (c_int, _GET_ALGORITHMS),
    # cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t dyDesc,
    #     const void *y, const cudnnConvolutionDescriptor_t convDesc,
    #     const cudnnFilterDescriptor_t dwDesc, void *dw, const int requestedAlgoCount,
    #     int *returnedAlgoCount, cudnnConvolutionBwdFilterAlgoPerf_t *perfResults,
    #     void *workSpace, size_t workSpaceSizeInBytes)
    "cudnnFindConvolutionBackwardFilterAlgorithmEx": (c_int, _FIND_ALGORITHMS),
    # cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    #     cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes)
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": (c_int, _WORKSPACE_SIZE),
    # cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t dyDesc,
    #     const void *dy, const cudnnConvolutionDescriptor_t convDesc,
    #     cudnnConvolutionBwdFilterAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes,
    #     const void *beta, const cudnnFilterDescriptor_t dwDesc, void *dw)
    "cudnnConvolutionBackwardFilter": (c_int, _CONVOLVE),
    # --- backend (graph) API ---------------------------------------------------------------------
    # cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
    #     cudnnBackendDescriptor_t *descriptor)
    "cudnnBackendCreateDescriptor": (c_int, (c_int, _pp)),
    # cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor)
    "cudnnBackendDestroyDescriptor": (c_int, (_p,)),
    # cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor)
    "cudnnBackendFinalize": (c_int, (_p,)),
    # cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
    #     cudnnBackendAttributeName_t attributeName, cudnnBackendAttributeType_t attributeType,
    #     int64_t elementCount, const void *arrayOfElements)
    "cudnnBackendSetAttribute": (c_int, (_p, c_int, c_int, c_int64, _p)),
    # cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
    #     cudnnBackendAttributeName_t attributeName, cudnnBackendAttributeType_t attributeType,
    #     int64_t requestedElementCount, int64_t *elementCount, void *arrayOfElements)
    "cudnnBackendGetAttribute": (c_int, (_p, c_int, c_int, c_int64, _pi64, _p)),
    # cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
    #     cudnnBackendDescriptor_t variantPack)
    "cudnnBackendExecute": (c_int, (_p, _p, _p)),
    # --- operations beside convolutions (pycudnn.ops) -------------------------------------------
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
    # --- batch normalization and dropout ---------------------------------------------------------
    # --- batch normalization ---------------------------------------------------------------------
    # cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derivedBnDesc,
    #     const cudnnTensorDescriptor_t xDesc, cudnnBatchNormMode_t mode)
    "cudnnDeriveBNTensorDescriptor": (c_int, (_p, _p, c_int)),
    # cudnnStatus_t cudnnBatchNormalizationForwardInference(cudnnHandle_t handle,
    #     cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc,
    #     void *y, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    #     const void *bnBias, const void *estimatedMean, const void *estimatedVariance,
    #     double epsilon)
    "cudnnBatchNormalizationForwardInference": (
        c_int, (_p, c_int, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, c_double)),
    # cudnnStatus_t cudnnBatchNormalizationForwardTraining(cudnnHandle_t handle,
    #     cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc,
    #     void *y, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    #     const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    #     void *resultRunningVariance, double epsilon, void *resultSaveMean,
    #     void *resultSaveInvVariance)
    "cudnnBatchNormalizationForwardTraining": (
        c_int, (_p, c_int, _p, _p, _p, _p, _p, _p, _p, _p, _p, c_double, _p, _p, c_double, _p,
                _p)),
    # cudnnStatus_t cudnnBatchNormalizationBackward(cudnnHandle_t handle,
    #     cudnnBatchNormMode_t mode, const void *alphaDataDiff, const void *betaDataDiff,
    #     const void *alphaParamDiff, const void *betaParamDiff,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t dyDesc,
    #     const void *dy, const cudnnTensorDescriptor_t dxDesc, void *dx,
    #     const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScale,
    #     void *dBnScaleResult, void *dBnBiasResult, double epsilon, const void *savedMean,
    #     const void *savedInvVariance)
    "cudnnBatchNormalizationBackward": (
        c_int, (_p, c_int, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, c_double, _p,
                _p)),
    # cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(cudnnHandle_t handle,
    #     cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    #     const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t zDesc,
    #     const cudnnTensorDescriptor_t yDesc, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc,
    #     const cudnnActivationDescriptor_t activationDesc, size_t *sizeInBytes)
    "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize": (
        c_int, (_p, c_int, c_int, _p, _p, _p, _p, _p, _psz)),
    # cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(cudnnHandle_t handle,
    #     cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    #     const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t yDesc,
    #     const cudnnTensorDescriptor_t dyDesc, const cudnnTensorDescriptor_t dzDesc,
    #     const cudnnTensorDescriptor_t dxDesc, const cudnnTensorDescriptor_t dBnScaleBiasDesc,
    #     const cudnnActivationDescriptor_t activationDesc, size_t *sizeInBytes)
    "cudnnGetBatchNormalizationBackwardExWorkspaceSize": (
        c_int, (_p, c_int, c_int, _p, _p, _p, _p, _p, _p, _p, _psz)),
    # cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(cudnnHandle_t handle,
    #     cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    #     const cudnnActivationDescriptor_t activationDesc, const cudnnTensorDescriptor_t xDesc,
    #     size_t *sizeInBytes)
    "cudnnGetBatchNormalizationTrainingExReserveSpaceSize": (
        c_int, (_p, c_int, c_int, _p, _p, _psz)),
    # cudnnStatus_t cudnnBatchNormalizationForwardTrainingEx(cudnnHandle_t handle,
    #     cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const void *alpha,
    #     const void *beta, const cudnnTensorDescriptor_t xDesc, const void *xData,
    #     const cudnnTensorDescriptor_t zDesc, const void *zData,
    #     const cudnnTensorDescriptor_t yDesc, void *yData,
    #     const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    #     const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    #     void *resultRunningVariance, double epsilon, void *resultSaveMean,
    #     void *resultSaveInvVariance, cudnnActivationDescriptor_t activationDesc,
    #     void *workspace, size_t workSpaceSizeInBytes, void *reserveSpace,
    #     size_t reserveSpaceSizeInBytes)
    "cudnnBatchNormalizationForwardTrainingEx": (
        c_int, (_p, c_int, c_int, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, c_double, _p, _p,
                c_double, _p, _p, _p, _p, c_size_t, _p, c_size_t)),
    # cudnnStatus_t cudnnBatchNormalizationBackwardEx(cudnnHandle_t handle,
    #     cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const void *alphaDataDiff,
    #     const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff,
    #     const cudnnTensorDescriptor_t xDesc, const void *xData,
    #     const cudnnTensorDescriptor_t yDesc, const void *yData,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dyData,
    #     const cudnnTensorDescriptor_t dzDesc, void *dzData,
    #     const cudnnTensorDescriptor_t dxDesc, void *dxData,
    #     const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScaleData,
    #     const void *bnBiasData, void *dBnScaleData, void *dBnBiasData, double epsilon,
    #     const void *savedMean, const void *savedInvVariance,
    #     cudnnActivationDescriptor_t activationDesc, void *workSpace,
    #     size_t workSpaceSizeInBytes, void *reserveSpace, size_t reserveSpaceSizeInBytes)
    "cudnnBatchNormalizationBackwardEx": (
        c_int, (_p, c_int, c_int, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p,
                _p, _p, _p, c_double, _p, _p, _p, _p, c_size_t, _p, c_size_t)),
    # cudnnStatus_t cudnnQueryRuntimeError(cudnnHandle_t handle, cudnnStatus_t *rstatus,
    #     cudnnErrQueryMode_t mode, cudnnRuntimeTag_t *tag)
    "cudnnQueryRuntimeError": (c_int, (_p, _pi, c_int, _p)),
    # --- dropout ---------------------------------------------------------------------------------
    # cudnnStatus_t cudnnCreateDropoutDescriptor(cudnnDropoutDescriptor_t *dropoutDesc)
    "cudnnCreateDropoutDescriptor": (c_int, (_pp,)),
    # cudnnStatus_t cudnnDestroyDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc)
    "cudnnDestroyDropoutDescriptor": (c_int, (_p,)),
    # cudnnStatus_t cudnnDropoutGetStatesSize(cudnnHandle_t handle, size_t *sizeInBytes)
    "cudnnDropoutGetStatesSize": (c_int, (_p, _psz)),
    # cudnnStatus_t cudnnDropoutGetReserveSpaceSize(cudnnTensorDescriptor_t xdesc,
    #     size_t *sizeInBytes)
    "cudnnDropoutGetReserveSpaceSize": (c_int, (_p, _psz)),
    # cudnnStatus_t cudnnSetDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc,
    #     cudnnHandle_t handle, float dropout, void *states, size_t stateSizeInBytes,
    #     unsigned long long seed)
    "cudnnSetDropoutDescriptor": (c_int, (_p, _p, c_float, _p, c_size_t, c_ulonglong)),
    # cudnnStatus_t cudnnRestoreDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc,
    #     cudnnHandle_t handle, float dropout, void *states, size_t stateSizeInBytes,
    #     unsigned long long seed)
    "cudnnRestoreDropoutDescriptor": (c_int, (_p, _p, c_float, _p, c_size_t, c_ulonglong)),
    # cudnnStatus_t cudnnGetDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc,
    #     cudnnHandle_t handle, float *dropout, void **states, unsigned long long *seed)
    "cudnnGetDropoutDescriptor": (c_int, (_p, _p, POINTER(c_float), _pp, POINTER(c_ulonglong))),
    # cudnnStatus_t cudnnDropoutForward(cudnnHandle_t handle,
    #     const cudnnDropoutDescriptor_t dropoutDesc, const cudnnTensorDescriptor_t xdesc,
    #     const void *x, const cudnnTensorDescriptor_t ydesc, void *y, void *reserveSpace,
    #     size_t reserveSpaceSizeInBytes)
    "cudnnDropoutForward": (c_int, (_p, _p, _p, _p, _p, _p, _p, c_size_t)),
    # cudnnStatus_t cudnnDropoutBackward(cudnnHandle_t handle,
    #     const cudnnDropoutDescriptor_t dropoutDesc, const cudnnTensorDescriptor_t dydesc,
    #     const void *dy, const cudnnTensorDescriptor_t dxdesc, void *dx, void *reserveSpace,
    #     size_t reserveSpaceSizeInBytes)
    "cudnnDropoutBackward": (c_int, (_p, _p, _p, _p, _p, _p, _p, c_size_t)),
}


class Library:
    """The loaded libcudnn: C functions bound lazily from `PROTOTYPES` as attributes; the same
    functions checked (`CheckedFunctions`) as ``checked``."""

    def __init__(self, cdll: ctypes.CDLL, path: str, found_via: str) -> None:
        self._cdll = cdll
        self.path = path
        self.found_via = found_via
        self._bind_lock = threading.Lock()
        self.checked = CheckedFunctions(self)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not yet bound; binds the row and caches it on the instance.
        if name.startswith("_") or name not in PROTOTYPES:
            raise AttributeError(f"{name!r} is not in pycudnn's prototype table")
        restype, argtypes = PROTOTYPES[name]
        with self._bind_lock:
            fn = getattr(self._cdll, name)  # AttributeError if the library lacks it
            fn.restype = restype
            fn.argtypes = list(argtypes)
            self.__dict__[name] = fn
        return fn


class CheckedFunctions:
    """The table's functions that return a ``cudnnStatus_t``, called so that a failure raises
    the `CudnnError` naming the function (``lib().checked.cudnnCreateTensorDescriptor(p)``), as
    numba's driver wraps its calls. For the cold path: a hot call site checks the status
    inline, one Python call less."""

    def __init__(self, library: Library) -> None:
        self._library = library

    def __getattr__(self, name: str) -> Callable[..., None]:
        # Only reached for names not yet wrapped; wraps the bound function and caches it.
        library = self._library
        getattr(library, name)  # AttributeError for a name outside the table
        if PROTOTYPES[name][0] is not c_int:
            raise AttributeError(f"{name!r} returns no cudnnStatus_t: call it unchecked")

        def checked(*args: Any) -> None:
            # looked up at each call (a cold path), so a replaced attribute of the library
            # object (a test's recorder) is the function called
            status = getattr(library, name)(*args)
            if status:
                raise_status(status, name)

        checked.__name__ = checked.__qualname__ = name
        self.__dict__[name] = checked
        return checked


_lock = threading.Lock()
_library: Library | None = None


class _Refused(Exception):
    """A candidate that pycudnn refuses without trying to open it."""


def _open_env_library(env: str) -> tuple[Any, str]:
    """Open the library PYCUDNN_LIBRARY names (an absolute path)."""
    if not os.path.isabs(env):
        raise _Refused(f"not an absolute path (relative to the current directory it would be "
                       f"{os.path.abspath(env)}); set PYCUDNN_LIBRARY to the absolute path of "
                       "libcudnn.so.9")
    return ctypes.CDLL(env, mode=ctypes.RTLD_GLOBAL), env


def _candidates(env: str | None) -> list[tuple[str, Callable[[], tuple[Any, Any]]]]:
    """(description, loader) in the order they are tried; each loader returns (CDLL, path).

    ``env`` is PYCUDNN_LIBRARY's value: when set (not empty) it is the only candidate."""
    if env:
        path = env
        return [(f"PYCUDNN_LIBRARY={env}", lambda: _open_env_library(path))]
    out: list[tuple[str, Callable[[], tuple[Any, Any]]]] = [
        (f"the NVIDIA cuDNN wheel ({WHEEL_LIBRARY})", _open_wheel_library)]

    def from_pathfinder() -> tuple[ctypes.CDLL, str]:
        from cuda.pathfinder import DynamicLibNotFoundError, load_nvidia_dynamic_lib

        try:
            loaded = load_nvidia_dynamic_lib("cudnn")
        except DynamicLibNotFoundError as exc:
            # the pathfinder loads cuDNN's dependencies (libcublasLt) before cuDNN itself: with
            # no cuDNN at all its error names the dependency, not what is missing
            first = str(exc).split("\n", 1)[0]
            if "cudnn" not in first.lower() and not cudnn_installed():
                raise DynamicLibNotFoundError(
                    "cuDNN not found (no NVIDIA cuDNN wheel, no libcudnn in $CONDA_PREFIX or on "
                    f"the system); the search stopped first at a dependency of cuDNN: {first}"
                ) from None
            raise
        # The library is already open in this process; CDLL on its path returns the same handle.
        return ctypes.CDLL(loaded.abs_path, mode=ctypes.RTLD_GLOBAL), loaded.abs_path

    out.append(('cuda.pathfinder.load_nvidia_dynamic_lib("cudnn")', from_pathfinder))
    for soname in ("libcudnn.so.9", "libcudnn.so"):
        def from_soname(s: str = soname) -> tuple[ctypes.CDLL, str]:
            return ctypes.CDLL(s, mode=ctypes.RTLD_GLOBAL), s

        out.append((soname, from_soname))
    return out


#: where the nvidia-cudnn-cu12 and -cu13 wheels put libcudnn, inside the ``nvidia.cudnn`` package
WHEEL_LIBRARY = "nvidia/cudnn/lib/libcudnn.so.9"


def wheel_library_path() -> str:
    """The path of the NVIDIA cuDNN wheel's ``libcudnn.so.9`` (the first ``nvidia.cudnn`` on
    ``sys.path`` that has one), found without importing anything but the namespace package.

    Raises:
        FileNotFoundError: no cuDNN wheel is installed, or it has no ``libcudnn.so.9``.
    """
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia.cudnn")
    except (ImportError, ValueError):
        spec = None
    for directory in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(directory, "lib", "libcudnn.so.9")
        if os.path.isfile(path):
            return path
    raise FileNotFoundError("no NVIDIA cuDNN wheel (the package nvidia.cudnn with "
                            "lib/libcudnn.so.9) is installed")


def _open_wheel_library() -> tuple[ctypes.CDLL, str]:
    # Opened by path: its sub-libraries find cuBLASLt and NVRTC through their own RUNPATH (the
    # cu12 and cu13 wheels' layouts both), loading them only when an engine needs them. Through
    # cuda.pathfinder the same file costs ~40-50 ms of imports and loads cuBLASLt eagerly
    # (~80 ms where nothing loaded it before).
    path = wheel_library_path()
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), path


def cudnn_installed() -> bool:
    """Whether a cuDNN library is anywhere pycudnn looks (an NVIDIA wheel, conda, the system's
    loader cache), without loading it. Public as a seam for tests and tooling."""
    import ctypes.util
    import glob
    import importlib.util

    with contextlib.suppress(ImportError, ValueError):
        if importlib.util.find_spec("nvidia.cudnn") is not None:
            return True
    conda = os.environ.get("CONDA_PREFIX")
    if conda and glob.glob(os.path.join(conda, "lib", "libcudnn.so*")):
        return True
    return ctypes.util.find_library("cudnn") is not None


#: what to do when no libcudnn loads (the end of that error, and of ``pycudnn info``'s answer)
INSTALL_HINT = ('install the cuDNN 9 wheel that matches your CUDA: pip install nvidia-cudnn-cu12 '
                '(or nvidia-cudnn-cu13), or set PYCUDNN_LIBRARY to the path of libcudnn.so.9')


def _load() -> Library:
    tried: list[str] = []
    env = os.environ.get("PYCUDNN_LIBRARY")
    for description, loader in _candidates(env):
        try:
            cdll, path = loader()
        except _Refused as exc:
            tried.append(f"  - {description}: refused: {exc}")
            continue
        except Exception as exc:  # OSError from dlopen, DynamicLibNotFoundError, ImportError
            tried.append(f"  - {description}: {type(exc).__name__}: {exc}")
            continue
        try:
            get_version = cdll.cudnnGetVersion
        except AttributeError:
            tried.append(f"  - {description}: loaded {path} but it has no cudnnGetVersion")
            continue
        get_version.restype = c_size_t
        get_version.argtypes = []
        ver = int(get_version())
        if ver < MIN_VERSION:
            # A library that loads but is too old is an error, not a reason to try the next
            # place: the user would otherwise run against a different cuDNN than they think.
            raise CudnnNotFoundError(
                f"pycudnn needs cuDNN >= 9.0 but found cuDNN {_format_version(ver)} at {path} "
                f"(via {description}); {INSTALL_HINT}")
        import logging

        logging.getLogger("pycudnn").debug("loaded cuDNN %s from %s (via %s)",
                                           _format_version(ver), path, description)
        return Library(cdll, str(path), description)
    if env:
        # Only PYCUDNN_LIBRARY was tried: another cuDNN may be installed, but it is not the one
        # asked for. The "  - " line keeps the shape of the list below (`pycudnn info` reads it).
        raise CudnnNotFoundError(
            f"could not load the libcudnn that PYCUDNN_LIBRARY names ({env}); pycudnn does not "
            "fall back to another cuDNN while it is set:\n" + "\n".join(tried)
            + "\nfix the path, or unset PYCUDNN_LIBRARY to use the cuDNN found otherwise "
            "(the cuDNN wheel: pip install nvidia-cudnn-cu12 or nvidia-cudnn-cu13)")
    raise CudnnNotFoundError("could not load libcudnn; tried, in order:\n" + "\n".join(tried)
                             + f"\n{INSTALL_HINT}")


def lib() -> Library:
    """The loaded library, loading it on first use (thread-safe)."""
    global _library
    library = _library
    if library is None:
        with _lock:
            if _library is None:
                _library = _load()
            library = _library
    return library


def is_loaded() -> bool:
    """Whether libcudnn has been opened by pycudnn in this process."""
    return _library is not None


@contextlib.contextmanager
def fresh_load() -> Iterator[None]:
    """Within the block, `lib()` loads libcudnn again, as a new process would (reading
    ``PYCUDNN_LIBRARY`` as it is then); after the block, the library loaded before it is back.

    For tests of loading. Other threads calling `lib()` meanwhile see the fresh load too.
    """
    global _library
    with _lock:
        saved, _library = _library, None
    try:
        yield
    finally:
        with _lock:
            _library = saved


# ---- status checking ----------------------------------------------------------------------------

def status_name(status: int) -> str:
    """Symbolic cuDNN 9 name of a status, e.g. ``CUDNN_STATUS_BAD_PARAM``."""

    try:
        return Status(status).symbol
    except ValueError:
        return f"CUDNN_STATUS_UNKNOWN_{status}"


def last_error_string() -> str:
    """cuDNN's explanation of the last failure on this thread (empty when there is none)."""
    buf = ctypes.create_string_buffer(1024)
    lib().cudnnGetLastErrorString(buf, 1024)
    return buf.value.decode("utf-8", "replace").strip()


def raise_status(status: int, function: str, *context: str) -> NoReturn:
    """Raise the `CudnnError` subclass for ``status`` returned by
    ``function``."""
    reason = last_error_string()
    raise error_class_for_status(status)(status, function, status_name(status), reason, list(context))


def check(status: int, function: str, *context: str) -> None:
    """Raise if ``status`` is not success (with ``context`` lines). Cold calls without context
    use ``lib().checked``; hot paths inline ``if status: raise_status(...)``."""
    if status:
        raise_status(status, function, *context)


# ---- versions -----------------------------------------------------------------------------------

def _format_version(v: int) -> str:
    return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"


def version() -> int:
    """cuDNN's version as cudnnGetVersion encodes it (e.g. 91900 for 9.19.0)."""
    return int(lib().cudnnGetVersion())


def version_tuple() -> tuple[int, int, int]:
    """cuDNN's version as ``(major, minor, patch)``."""
    v = version()
    return v // 10000, (v % 10000) // 100, v % 100


def library_path() -> str:
    """Path of the loaded libcudnn (loads it if needed)."""
    return lib().path


def cudart_version() -> int:
    """The CUDA runtime version cuDNN was built against (e.g. 12090 for 12.9)."""
    return int(lib().cudnnGetCudartVersion())
