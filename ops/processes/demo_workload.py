"""`python -m loadtest.demo`: the demo web tier `squealctl up --demo` runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ops.processes.base import REPO_ROOT, ManagedProcess, _http_ok


class DemoWorkload(ManagedProcess):
    """`python -m loadtest.demo`: the demo web tier driving every cluster at a modest rate."""

    name = "demo"
    start_timeout = 60.0

    def __init__(
        self,
        topology_path: str | Path,
        port: int | None = None,
        workdir: str | Path | None = None,
        rate: float = 40.0,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(port, workdir, host)
        self.topology_path, self.rate = Path(topology_path), rate

    def command(self) -> list[str]:
        python = Path(os.environ.get("VIRTUAL_ENV", REPO_ROOT / ".venv")) / "bin" / "python"
        return [
            str(python if python.exists() else sys.executable),
            "-m",
            "loadtest.demo",
            str(self.topology_path),
            "--rate",
            str(self.rate),
            "--metrics-port",
            str(self.port),
            "--host",
            self.host,
        ]

    def ready(self) -> bool:
        return _http_ok(f"http://{self.host}:{self.port}/metrics")
