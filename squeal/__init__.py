"""squeal (in progress)."""
