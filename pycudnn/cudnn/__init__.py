"""Layer 3, cuDNN objects: legacy descriptors, operation graphs and execution plans, and
the tensor operations (transform, add, bias, ReLU) built on them."""
