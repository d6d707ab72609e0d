"""`pip install .` gives a working squeal: the wheel carries every package, its data files, and the native
binlog reader compiled from squeal_native/ (issue 15: the extension is part of the package, not a side step).

The wheel is built without build isolation (setuptools-rust is pinned in the dev extras) so the test needs no
network, and in-tree, so cargo reuses squeal_native/target from scripts/setup.sh's build.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (built,) = out.glob("squeal-*.whl")
    return built


def test_the_wheel_carries_the_native_reader_and_the_packages(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    native = [n for n in names if n.startswith("squeal/squeal_native") and n.endswith(".so")]
    assert native, f"no compiled squeal_native in {wheel.name}: {sorted(names)[:20]}…"
    for expected in ("squeal/shard/daemon.py", "router_config/__init__.py", "ops/cli.py", "monitoring/dashboard.html"):
        assert expected in names, expected


def test_the_native_reader_from_the_wheel_imports(wheel: Path, tmp_path: Path) -> None:
    zipfile.ZipFile(wheel).extractall(tmp_path)
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "from squeal import squeal_native; print(squeal_native.__file__); "
            "print(hasattr(squeal_native, 'NativeStream'))",
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    where, has_reader = probe.stdout.split()
    assert Path(where).is_relative_to(tmp_path), where
    assert has_reader == "True"
