"""Operation graphs, candidate engine configs and execution plans (the cuDNN graph engine).

Two modules: `build` (tensors, convolution and pointwise graphs, epilogues) and `plan` (engine
configs from heuristics, filtering, execution plans). This package hands their public names on.

The flow, as PyTorch's ``Conv_v8.cpp`` does it through cudnn-frontend::

    g = build_convolution_graph(handle, "forward", x, w, y, padding, stride, dilation, "float32")
    cands = engine_configs(handle, g)                      # heuristics A, B, FALLBACK; deduped
    kept, dropped = filter_candidates(cands, "float32", allow_tf32=False, deterministic=False)
    plan, failures = first_plan(handle, kept)              # finalize until one works
    plan.execute(handle, (x_ptr, w_ptr, y_ptr), workspace_ptr)

Tensors are always described in N, C, spatial order; the strides carry the layout (NHWC is
``strides = (H*W*C, 1, W*C, C)``). Groups are implied by the shapes: x has C channels, w has
C / groups input channels.

Execution is the hot path: `ExecutionPlan.execute()` with pointers seen before is a dict
lookup plus one ctypes call to ``cudnnBackendExecute``. A variant pack holds raw pointers, so it is
reusable only with the same buffers; a small LRU keeps the packs of the last few buffer sets.
"""

from .build import (DIRECTIONS, Epilogue, OperationGraph, PointwiseStep, TensorSpec, bias_spec,
                    build_convolution_graph, build_pointwise_graph, nchw_strides, nhwc_strides)
from .plan import (CandidateList, EngineConfig, ExecutionPlan, LazyCandidates, candidate_refusal,
                   engine_configs, filter_candidates, first_plan, iter_engine_configs)

__all__ = [
    "TensorSpec", "Epilogue", "OperationGraph", "EngineConfig", "CandidateList", "ExecutionPlan",
    "build_convolution_graph", "engine_configs", "iter_engine_configs", "LazyCandidates",
    "filter_candidates", "candidate_refusal", "first_plan",
    "nchw_strides", "nhwc_strides", "bias_spec", "DIRECTIONS", "PointwiseStep",
    "build_pointwise_graph",
]
