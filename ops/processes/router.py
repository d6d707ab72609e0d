"""squeal-router, the Rust binary, serving one cluster's config."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from ops.processes.base import REPO_ROOT, HarnessError, ManagedProcess
from ops.processes.memcached import memcached_command

ROUTER_BIN = Path(os.environ.get("SQUEAL_ROUTER_BIN", REPO_ROOT / "router/target/release/squeal-router"))


class Router(ManagedProcess):
    """squeal-router (the Rust binary built by scripts/setup.sh) serving one cluster's config.

    `tls` = (certificate, key, CA) makes `port` a TLS-only port (`--ssl-port`, no plaintext `-p`: what a
    topology with `[tls]` runs): the router serves its certificate there, verifies TLS pools' memcached against
    the CA (`--pem-ca-path`) and presents the same certificate to them; its readiness check verifies it too.
    `ssl_port` instead adds a TLS port beside the plaintext one (its certificate flags in `extra_args`)."""

    name = "router"

    def __init__(
        self,
        config_path: str | Path,
        port: int | None = None,
        workdir: str | Path | None = None,
        metrics_port: int | None = None,
        spool_dir: str | Path | None = None,
        host: str = "127.0.0.1",
        extra_args: tuple[str, ...] = (),
        ssl_port: int | None = None,
        tls: tuple[str | Path, str | Path, str | Path] | None = None,
    ) -> None:
        super().__init__(port, workdir, host)
        # a TLS port beside the plaintext one (`--ssl-port`; its certificate flags go in extra_args)
        self.ssl_port = ssl_port
        self.tls = tls
        if tls is not None and ssl_port is not None:
            raise HarnessError("Router: tls (a TLS-only port) and ssl_port (a TLS port beside -p) exclude each other")
        if not ROUTER_BIN.exists():
            raise HarnessError(f"{ROUTER_BIN} not built: run scripts/setup.sh (cargo build --release in router/)")
        self.config_path = Path(config_path)
        self.metrics_port = metrics_port
        self.spool_dir = Path(spool_dir) if spool_dir else self.workdir / f"spool-{self.port}"
        self.extra_args = extra_args

    def command(self) -> list[str]:
        cmd = [str(ROUTER_BIN), "--config-file", str(self.config_path)]
        if self.tls is None:
            cmd += ["-p", str(self.port)]
        else:
            cert, key, ca = self.tls
            cmd += ["--ssl-port", str(self.port), "--pem-cert-path", str(cert), "--pem-key-path", str(key)]
            cmd += ["--pem-ca-path", str(ca)]
        cmd += ["--listen", self.host, "--spool-dir", str(self.spool_dir)]
        if self.metrics_port:
            cmd += ["--metrics-port", str(self.metrics_port)]
        if self.ssl_port:
            cmd += ["--ssl-port", str(self.ssl_port)]
        return cmd + list(self.extra_args)

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client context for `port` (None: plaintext), verifying the router against its CA."""
        return ssl.create_default_context(cafile=str(self.tls[2])) if self.tls is not None else None

    def ready(self) -> bool:
        reply = memcached_command((self.host, self.port), b"version\r\n", tls=self.ssl_context())
        return reply.startswith(b"VERSION")
