"""Layer 1, the C boundary: libcudnn loaded through ctypes (one prototype table, statuses
turned into exceptions) and the backend (graph) API's typed descriptors. No policy."""
