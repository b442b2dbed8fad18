"""Layer 7, the public convolution functions: one call path (remembered replay, full path,
fallback), prepared convolutions, the repro attached to a failing call's error, and what acts
on every cache."""
