"""gutter (in progress)."""
