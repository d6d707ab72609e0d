# The two commands the README promises. Both run scripts/setup.sh first (idempotent).
.PHONY: setup demo test lint down

setup:
	@bash scripts/setup.sh

# The main job: a local two-region topology with a demo workload and the dashboard.
demo: setup
	.venv/bin/squealctl up examples/local.toml --demo

down:
	.venv/bin/squealctl down

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	.venv/bin/mypy
	# no import circle between a Rust crate's modules (the router's old one is gone: issue 36)
	.venv/bin/python scripts/rust_module_cycles.py router/src
	.venv/bin/python scripts/rust_module_cycles.py squeal_native/src
	@if [ -f router/Cargo.toml ]; then cd router && cargo fmt --check && cargo clippy --locked -q --all-targets -- -D warnings; fi
	@if [ -f squeal_native/Cargo.toml ]; then cd squeal_native && cargo fmt --check && cargo clippy --locked -q --all-targets -- -D warnings; fi
	@if [ -f model/Cargo.toml ]; then cd model && cargo fmt --check && cargo clippy --locked -q --all-targets -- -D warnings; fi

# All tests: lint, the router's, native reader's and protocol model's cargo tests, then every Python test (unit + integration with real servers).
test: setup lint
	@if [ -f router/Cargo.toml ]; then cd router && cargo test --locked -q; fi
	@if [ -f squeal_native/Cargo.toml ]; then cd squeal_native && cargo test --locked -q --no-default-features; fi
	@# The protocol model (docs/model.md): release, since the checker explores ~10^6 states.
	@if [ -f model/Cargo.toml ]; then cd model && cargo test --locked --release -q; fi
	.venv/bin/pytest
