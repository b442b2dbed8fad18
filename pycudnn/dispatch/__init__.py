"""Layer 7, between the public functions and the search: prepared (replayed) convolutions,
argument checks shared by full and replayed calls, and preloading the tuning database."""
