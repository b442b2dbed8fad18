"""Layer 2, CUDA resources: devices, streams, stream-ordered memory, cuDNN handles, and
`Tensor` views of device memory with the array interfaces of other libraries."""
