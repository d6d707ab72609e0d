"""monitoring (in progress)."""
