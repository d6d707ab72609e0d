"""warmup (in progress)."""
