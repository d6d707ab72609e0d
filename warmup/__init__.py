"""Cold-cluster warm-up: turn the warm-up route on and off, and watch the hit rate (paper 4.3)."""

from warmup.controller import DEFAULT_TARGET, WarmupController, WarmupError, WarmupStatus

__all__ = ["DEFAULT_TARGET", "WarmupController", "WarmupError", "WarmupStatus"]
