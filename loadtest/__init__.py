"""loadtest (in progress)."""
