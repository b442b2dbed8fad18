"""The C functions of cuDNN's batch normalization and dropout that pycudnn binds.

`PROTOTYPES` has the row format of `pycudnn._lib.PROTOTYPES` (name: (restype, argtypes), the C
signature from ``cudnn_ops_v9.h`` or ``cudnn_graph_v9.h`` in the comment above each row).
Importing this module adds the rows to that table, through which every C function is bound on
first use; they are meant to move into it.
"""

from __future__ import annotations

from ctypes import POINTER, c_double, c_float, c_int, c_size_t, c_ulonglong, c_void_p

from pycudnn import _lib

__all__ = ["PROTOTYPES"]

_p = c_void_p          # any handle, descriptor or device pointer
_pi = POINTER(c_int)
_psz = POINTER(c_size_t)
_pp = POINTER(c_void_p)

# name: (restype, argtypes)   C signature in the comment above each row.
PROTOTYPES: dict[str, tuple[object, tuple]] = {
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
    # cudnnStatus_t cudnnActivationBackward(cudnnHandle_t handle,
    #     cudnnActivationDescriptor_t activationDesc, const void *alpha,
    #     const cudnnTensorDescriptor_t yDesc, const void *y, const cudnnTensorDescriptor_t dyDesc,
    #     const void *dy, const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    #     const cudnnTensorDescriptor_t dxDesc, void *dx)
    "cudnnActivationBackward": (c_int, (_p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p)),
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

_lib.PROTOTYPES.update(PROTOTYPES)
