"""remote_markers (in progress)."""
