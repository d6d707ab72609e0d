"""memcached's own test suite (tag 1.6.18, `t/*.t`) run through squeal-router: what it checks about
the text protocol must pass through the router as it passes against memcached itself.

The suite is not in this repository: scripts/setup.sh fetches the Debian source package of the
installed memcached (1.6.18) into `var/memcached-src/` (gitignored). `tests/router/perl/SquealSuite.pm`
(ours) replaces the suite's `new_memcached` so that each server a test starts is a real memcached plus
a squeal-router in front of it (one PoolRoute, `--enable-flush-cmd`, `--max-item-size` as the test's
`-I`); the test talks to the router. Run one file by hand (unset SQUEAL_ROUTER_BIN: against memcached
itself, the baseline):

    cd var/memcached-src/memcached-1.6.18 && \\
      SQUEAL_ROUTER_BIN=$PWD/../../../router/target/release/squeal-router \\
      perl -It/lib -I../../../tests/router/perl -MSquealSuite t/getset.t

Files that do not apply are listed in NOT_APPLICABLE with the reason (mirrored in docs/router.md,
"memcached's test suite"); single assertions the router cannot pass by design are skipped by place
(SKIPPED_ASSERTIONS), reported as TAP skips with the reason.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.binaries import require_binary
from tests.router.conftest import REPO, ROUTER_BIN

SUITE = REPO / "var/memcached-src/memcached-1.6.18"
SHIM = REPO / "tests/router/perl"

_STATS = "memcached's per-server memory/slab/LRU internals, read through `stats <group>` or its counters"

# Every t/*.t of memcached 1.6.18 that is not run here, and why.
NOT_APPLICABLE: dict[str, str] = {
    # other protocols and transports
    **{
        f: "binary protocol (the router speaks the text protocol only)"
        for f in ("binary.t", "binary-get.t", "binary-sasl.t", "issue_50.t")
    },
    # TLS: the files that test memcached's own TLS server knobs (the router's TLS port has its own flags)
    "ssl_cert_refresh.t": "memcached's `refresh_certs` admin command and its time_since_server_cert_refresh stat "
    "(the router reloads its certificates on SIGHUP or a change of the files)",
    "ssl_settings.t": "`stats settings` (memcached's ssl_* settings); the router answers `stats <group>` with ERROR",
    "ssl_verify_modes.t": "memcached's `-o ssl_verify_mode` and its accepting_conns stat (the router's is "
    "--ssl-require-peer-certs, tested in test_router_tls.py)",
    "udp.t": "UDP (the router listens on TCP only)",
    "unixsocket.t": "unix domain sockets (the router listens on TCP only)",
    "stats-conns.t": "unix domain sockets and memcached's per-connection table (`stats conns`)",
    # server features and internals
    **{
        f: "extstore, memcached's flash storage engine (server internals)"
        for f in (
            "extstore.t",
            "extstore-buckets.t",
            "extstore-jbod.t",
            "binary-extstore.t",
            "chunked-extstore.t",
            "error-extstore.t",
        )
    },
    "proxy.t": "memcached's built-in proxy (not compiled into Debian's memcached; skips itself)",
    "restart.t": "warm restart from a memory file (-e), a server feature",
    **{
        f: _STATS
        for f in (
            "64bit.t",
            "dash-M.t",
            "dyn-maxbytes.t",
            "evictions.t",
            "issue_14.t",
            "issue_22.t",
            "issue_29.t",
            "issue_41.t",
            "issue_42.t",
            "issue_104.t",
            "issue_163.t",
            "issue_183.t",
            "item_size_max.t",
            "lru.t",
            "lru-crawler.t",
            "lru-maintainer.t",
            "slabs_reassign.t",
            "slabs-reassign2.t",
            "slabs-reassign-chunked.t",
            "stats.t",
            "stats-detail.t",
        )
    },
    "00-startup.t": "memcached's command-line options and `stats settings`",
    "daemonize.t": "memcached's -d and pid file",
    "issue_67.t": "memcached's listening options (-p, -U, -l)",
    "maxconns.t": "memcached's connection limit (-c): the router holds one connection per server",
    "conn-limits.t": "memcached's per-connection buffer limits (read_buf_mem_limit) and their stats",
    "idle-timeout.t": "memcached's idle_timeout of client connections and its stats",
    "shutdown.t": "the `shutdown` command, which the router deliberately does not forward",
    "watcher.t": "`watch` log streams of one server",
    "watcher_connid.t": "`watch` log streams of one server",
    "expirations.t": "needs `debugtime` (memcached-debug builds only): fails against Debian's memcached too",
    # files the suite skips itself on this build
    "issue_140.t": "skips itself (upstream: the fix was an illusion)",
    "issue_260.t": "skips itself (needs artificial conditions)",
    "misbehave.t": "skips itself (memcached-debug only: privilege drop)",
    "refhang.t": "skips itself (needs special hooks)",
    "slabhang.t": "skips itself (needs special hooks)",
    "whitespace.t": "skips itself (checks memcached's git tree)",
}

# Assertions (file:line in 1.6.18) the router cannot pass by design, with the reason.
SKIPPED_ASSERTIONS: dict[str, str] = {
    "t/flush-all.t:71": "flush_all goes to every server; a server's refusal (-F) comes back as the router's "
    "`SERVER_ERROR flush_all failed on 1 of 1 servers: ... (CLIENT_ERROR flush_all not allowed)`",
    "t/strtol-testing.t:16": "`slabs automove` is a server admin command the router does not forward",
    "t/issue_61.t:20": "conn_yields is memcached's per-connection worker counter (`stats`)",
}

# Run with SSL_TEST=1 (memcached's own switch): every hop TLS, the client -> router on an --ssl-port with
# the suite's own certificates, the router -> memcached -Z (pool security_mech tls). The ssl_* files
# that apply, and a few protocol files to show the same answers over TLS.
OVER_TLS = ["ssl_ports.t", "ssl_proto_version.t", "ssl_session_resumption.t"]
ALSO_OVER_TLS = ["cas.t", "flags.t", "incrdecr.t", "metaget.t", "noreply.t", "touch.t"]
SKIPPED_ASSERTIONS["t/ssl_proto_version.t:27"] = (
    "`-o ssl_min_version` is memcached's option: the router's TLS port offers rustls' defaults (TLS 1.2 and 1.3)"
)

ALL_FILES = sorted(p.name for p in SUITE.glob("t/*.t")) if SUITE.is_dir() else []
APPLICABLE = [f for f in ALL_FILES if f not in NOT_APPLICABLE and f not in OVER_TLS]


def test_every_file_is_classified() -> None:
    require_binary(SUITE.is_dir(), f"memcached's source is not in {SUITE} (scripts/setup.sh fetches it)")
    assert set(NOT_APPLICABLE) <= set(ALL_FILES), set(NOT_APPLICABLE) - set(ALL_FILES)
    assert len(APPLICABLE) >= 20, APPLICABLE


@pytest.mark.parametrize("name", APPLICABLE or ["(memcached source missing)"])
def test_memcached_suite_file_passes_through_router(name: str, tmp_path: Path) -> None:
    run_file(name, tmp_path)


@pytest.mark.parametrize("name", OVER_TLS + ALSO_OVER_TLS)
def test_memcached_suite_file_passes_through_router_over_tls(name: str, tmp_path: Path) -> None:
    has_ssl = subprocess.run(["perl", "-MIO::Socket::SSL", "-e1"], capture_output=True).returncode == 0
    require_binary(has_ssl, "perl's IO::Socket::SSL is missing (scripts/setup.sh installs libio-socket-ssl-perl)")
    run_file(name, tmp_path, {"SSL_TEST": "1"})


def run_file(name: str, tmp_path: Path, more_env: dict[str, str] | None = None) -> None:
    require_binary(SUITE.is_dir(), f"memcached's source is not in {SUITE} (scripts/setup.sh fetches it)")
    env = dict(
        os.environ,
        SQUEAL_ROUTER_BIN=str(ROUTER_BIN),
        SQUEAL_SUITE_TMP=str(tmp_path),
        SQUEAL_SUITE_SKIP="\n".join(f"{where}\t{why}" for where, why in SKIPPED_ASSERTIONS.items()),
        **(more_env or {}),
    )
    cmd = ["perl", "-It/lib", f"-I{SHIM}", "-MSquealSuite", f"t/{name}"]
    proc = subprocess.run(cmd, cwd=SUITE, env=env, capture_output=True, timeout=90)
    tap = proc.stdout.decode(errors="replace")
    failed = [line[:300] for line in tap.splitlines() if line.startswith("not ok")]
    detail = "\n".join(failed[:20]) + "\n" + proc.stderr.decode(errors="replace")[-3000:]
    assert proc.returncode == 0 and not failed, f"{name}: exit {proc.returncode}\n{detail}"
    assert any(line.startswith("1..") for line in tap.splitlines()), f"{name}: no TAP plan\n{detail}"
