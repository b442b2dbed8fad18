"""Layer 4, what a problem is and who solves it: the direction table and cache key, the engine
contract, the legacy (v7) and graph engines, and the registry of engines by name."""
