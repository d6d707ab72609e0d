"""The processes squeal runs against and consists of, one module per kind, each with its command line and readiness
check: `memcached`, `mariadb`, `router`, `zookeeper`, `squeal_daemon`, `monitoring_server`, `demo_workload`; what
they share (`ManagedProcess`, `wait_until`, free ports) is `base`. ops/harness.py re-exports them all."""
