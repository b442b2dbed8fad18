"""Layer 8, the public convolution functions: one call path (remembered replay, full path,
fallback), the repro attached to a failing call's error, and what acts on every cache."""
