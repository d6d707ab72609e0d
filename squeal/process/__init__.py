"""The process around the pipelines: what `squeal run` serves and reports as a whole.

shell    the process shell: the status site (/metrics, /healthz, /sampled-deletes), signals, the run loop
metrics  the daemon's Prometheus registry (`squeal_*` series), set by every stage
healthz  the one client of a daemon's /healthz (squealctl, the dashboard, benchmarks, tests)
"""
