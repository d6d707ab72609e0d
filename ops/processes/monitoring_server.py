"""`python -m monitoring serve`: the dashboard, the prober and the scrapes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ops.processes.base import REPO_ROOT, ManagedProcess, _http_ok


class MonitoringServer(ManagedProcess):
    """`python -m monitoring serve`: scrapes the deployment, runs the prober, serves the dashboard."""

    name = "monitoring"
    start_timeout = 60.0  # its imports alone take seconds; on a loaded box, while squeal starts, tens of them

    def __init__(
        self,
        topology_path: str | Path,
        state_dir: str | Path,
        port: int | None = None,
        workdir: str | Path | None = None,
        extra_args: tuple[str, ...] = (),
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(port, workdir, host)
        self.topology_path, self.state_dir, self.extra_args = Path(topology_path), Path(state_dir), extra_args

    def command(self) -> list[str]:
        python = Path(os.environ.get("VIRTUAL_ENV", REPO_ROOT / ".venv")) / "bin" / "python"
        return [
            str(python if python.exists() else sys.executable),
            "-m",
            "monitoring",
            "serve",
            str(self.topology_path),
            "--state-dir",
            str(self.state_dir),
            "--port",
            str(self.port),
            "--host",
            self.host,
            *self.extra_args,
        ]

    def ready(self) -> bool:
        return _http_ok(f"http://{self.host}:{self.port}/healthz")
