"""cuDNN's operations beside convolutions: activations, softmax, pooling, and (by their own modules)
batch normalization and dropout.

Each operation has its own module (`pycudnn.ops.activation`, `pycudnn.ops.softmax`,
`pycudnn.ops.pooling`, ...); importing this package imports none of them, and none opens libcudnn
before its first call.
"""
