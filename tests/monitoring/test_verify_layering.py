"""Layering: the consistency checker reads the topology and a codec the web tier registers; it never imports the
demo web tier (loadtest) itself, directly or through anything it imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import monitoring.verify

REPO = Path(__file__).resolve().parents[2]


def test_verify_source_imports_nothing_from_loadtest():
    sources = sorted(Path(monitoring.verify.__file__).parent.glob("*.py"))
    assert len(sources) > 5, sources  # the package's modules, not only its __init__
    imported = [
        name
        for source in sources
        for node in ast.walk(ast.parse(source.read_text()))
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    ]
    assert imported and not [m for m in imported if m.split(".")[0] == "loadtest"], imported


def test_importing_verify_loads_no_loadtest_module():
    probe = "import sys, monitoring.verify; print(sorted(m for m in sys.modules if m.split('.')[0] == 'loadtest'))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
