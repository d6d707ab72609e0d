"""`squeal run`: a region's daemon or one worker of its pool."""

from __future__ import annotations

import os
from pathlib import Path

from ops.processes.base import REPO_ROOT, ManagedProcess, _http_ok


class SquealDaemon(ManagedProcess):
    """`squeal run TOPOLOGY --region R`: the invalidation daemon for one region's database.

    Ready when its `/healthz` answers 200 on `metrics_port` (this object's `port`).
    """

    name = "squeal"

    def __init__(
        self,
        topology_path: str | Path,
        region: str,
        port: int | None = None,
        workdir: str | Path | None = None,
        state_dir: str | Path | None = None,
        extra_args: tuple[str, ...] = (),
        host: str = "127.0.0.1",
        instance: str | None = None,
    ) -> None:
        super().__init__(port, workdir, host)
        self.topology_path = Path(topology_path)
        self.region = region
        self.instance = instance  # a pool's worker: `--instance NAME` (it owns what the controller gives it)
        me = instance or region
        self.state_dir = Path(state_dir) if state_dir else self.workdir / f"state-{me}"
        self.extra_args = (("--instance", instance) if instance else ()) + tuple(extra_args)
        self.log_file = self.workdir / f"squeal-{me}.log"

    def command(self) -> list[str]:
        exe = Path(os.environ.get("VIRTUAL_ENV", REPO_ROOT / ".venv")) / "bin" / "squeal"
        return [
            str(exe if exe.exists() else "squeal"),
            "run",
            str(self.topology_path),
            "--region",
            self.region,
            "--metrics-port",
            str(self.port),
            "--state-dir",
            str(self.state_dir),
            *self.extra_args,
        ]

    def ready(self) -> bool:
        # Serving /healthz is "started": a daemon that starts halted (binlog data loss, on_data_loss = "halt")
        # answers 503 with its reason, and must stay up for the operator to see it and recover.
        return _http_ok(f"http://{self.host}:{self.port}/healthz", unhealthy_ok=True)
