"""Tests that need a binary (the router, promtool, chromedriver, ...): skipped where it is missing, failed in CI.

On a developer's machine a test whose binary is not built or installed skips with the reason. In CI
(`.ci/run` exports SQUEAL_REQUIRE_BINARIES=1, after `scripts/setup.sh` built and installed everything) such a
skip would let the run pass without the test, so the same test fails instead, naming what is missing.

    pytestmark = needs_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")   # a module or test
    require_binary(shutil.which("memcstat") is not None, "libmemcached-tools not installed")  # in a fixture
"""

from __future__ import annotations

import os

import pytest

REQUIRE_ENV = "SQUEAL_REQUIRE_BINARIES"


def binaries_required() -> bool:
    """The run must not skip for a missing binary (CI)."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def require_binary(present: bool, reason: str) -> None:
    """Skip the calling test or fixture unless `present`; under SQUEAL_REQUIRE_BINARIES=1 fail it instead."""
    if present:
        return
    if binaries_required():
        pytest.fail(
            f"{reason} ({REQUIRE_ENV}={os.environ[REQUIRE_ENV]}: a missing binary fails the run)", pytrace=False
        )
    pytest.skip(reason)


def needs_binary(present: bool, reason: str) -> pytest.MarkDecorator:
    """A mark for a test, a class or a module (`pytestmark`): `require_binary(present, reason)` before each test
    runs (`pytest_runtest_setup` below, which tests/conftest.py imports)."""
    return pytest.mark.needs_binary(present=present, reason=reason)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The hook behind `needs_binary` marks (a conftest that imports it has it)."""
    for mark in item.iter_markers("needs_binary"):
        require_binary(mark.kwargs["present"], mark.kwargs["reason"])
