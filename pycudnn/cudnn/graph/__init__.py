"""Operation graphs, candidate engine configs and execution plans (the cuDNN graph engine).

Three modules: `build` (tensors, convolution and pointwise graphs, epilogues), `batchnorm`
(graphs that fuse batch normalization into the convolutions around it) and `plan` (engine
configs from heuristics, filtering, execution plans); this package hands their public names on.
docs/architecture.md ("The graph engine's calls") shows how they are called in turn.

Tensors are always described in N, C, spatial order; the strides carry the layout (NHWC is
``strides = (H*W*C, 1, W*C, C)``). Groups are implied by the shapes: x has C channels, w has
C / groups input channels.

Execution is the hot path: `ExecutionPlan.execute()` with pointers seen before is a dict lookup
plus one ctypes call to ``cudnnBackendExecute``. A variant pack holds raw pointers, so it is
reusable only with the same buffers; a small LRU keeps the packs of the last few buffer sets.
"""

from .build import (DIRECTIONS, Epilogue, OperationGraph, PointwiseStep, TensorSpec, bias_spec,
                    build_convolution_graph, build_pointwise_graph, nchw_strides, nhwc_strides)
from .batchnorm import (PLAIN_DTYPES, PROLOGUE_DTYPES, WGRAD_DTYPES, FusionDtypes, ScaleBiasRelu,
                        build_bn_finalize_graph, build_conv_genstats_graph,
                        build_dgrad_drelu_dbn_graph, build_sbr_wgrad_graph, channel_spec)
from .plan import (CandidateList, EngineConfig, ExecutionPlan, LazyCandidates, candidate_refusal,
                   engine_configs, filter_candidates, first_plan, iter_engine_configs)

__all__ = [
    "TensorSpec", "Epilogue", "OperationGraph", "EngineConfig", "CandidateList", "ExecutionPlan",
    "build_convolution_graph", "engine_configs", "iter_engine_configs", "LazyCandidates",
    "filter_candidates", "candidate_refusal", "first_plan",
    "nchw_strides", "nhwc_strides", "bias_spec", "DIRECTIONS", "PointwiseStep",
    "build_pointwise_graph", "ScaleBiasRelu", "FusionDtypes", "PROLOGUE_DTYPES", "PLAIN_DTYPES",
    "WGRAD_DTYPES", "channel_spec", "build_conv_genstats_graph",
    "build_bn_finalize_graph", "build_sbr_wgrad_graph", "build_dgrad_drelu_dbn_graph",
]
