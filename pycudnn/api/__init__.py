"""Layer 6, the public convolution functions: one call path (remembered replay, full path,
fallback) and the repro attached to a failing call's error."""
