"""leases (in progress)."""
