"""tests/binaries.py: a test whose binary is missing skips, and fails under SQUEAL_REQUIRE_BINARIES=1 (CI)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

MODULE = """
import pytest
from tests.binaries import needs_binary, require_binary

pytestmark = needs_binary({present}, "frobnicator not installed")

def test_marked():
    pass

@pytest.fixture
def frob():
    require_binary({present}, "frobnicator not installed")

def test_fixture(frob):
    pass
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest("from tests.binaries import pytest_runtest_setup  # noqa: F401\n")
    pytester.makeini("[pytest]\nmarkers =\n    needs_binary(present, reason): tests/binaries.py\n")
    return pytester


@pytest.mark.parametrize("required", ["", "0"])
def test_a_missing_binary_skips_on_a_developer_s_machine(project, monkeypatch, required) -> None:
    monkeypatch.setenv("SQUEAL_REQUIRE_BINARIES", required)
    project.makepyfile(MODULE.format(present=False))
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(skipped=2)


def test_a_missing_binary_fails_the_run_in_ci(project, monkeypatch) -> None:
    monkeypatch.setenv("SQUEAL_REQUIRE_BINARIES", "1")
    project.makepyfile(MODULE.format(present=False))
    result = project.runpytest("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(errors=2)  # both fail in their setup, before the test body
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*frobnicator not installed (SQUEAL_REQUIRE_BINARIES=1*"])


def test_a_present_binary_runs(project, monkeypatch) -> None:
    monkeypatch.setenv("SQUEAL_REQUIRE_BINARIES", "1")
    project.makepyfile(MODULE.format(present=True))
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_ci_requires_the_binaries() -> None:
    from pathlib import Path

    run = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text().splitlines()
    commands = [line.strip() for line in run if line.strip() and not line.lstrip().startswith("#")]
    assert "export SQUEAL_REQUIRE_BINARIES=1" in commands
    assert commands.index("export SQUEAL_REQUIRE_BINARIES=1") < commands.index("make test")
    assert commands[-1] == "make test"
