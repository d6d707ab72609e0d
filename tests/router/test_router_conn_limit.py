"""At the connection limit the router answers new clients as memcached does at its `-c` limit (issue 26 item 4):
`ERROR Too many open connections`, then close, never a client left hanging in the accept queue; one log line per
change of state, a counter in `stats` and /metrics, and new clients served again once others leave.

memcached 1.6.18 (verified here with `memcached -c 40`): a client over the limit is accepted, gets
`ERROR Too many open connections\\r\\n` and is closed; `stats` counts it in `rejected_connections`."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest

from ops.harness import Router, free_port
from tests.router.conftest import Conn, wait_for

FD_LIMIT = 64
CLIENTS = 200
REFUSAL = b"ERROR Too many open connections"


class LimitedRouter(Router):
    """A router started under `prlimit --nofile=64` (RLIMIT_NOFILE set for the child only)."""

    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}", "--", *super().command()]


def first_line(sock: socket.socket) -> bytes | None:
    """The first reply line, b"" for a close without one, None if nothing came (a hang)."""
    buf = b""
    try:
        while b"\r\n" not in buf:
            chunk = sock.recv(4096)
            if not chunk:
                return buf
            buf += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        return buf
    return buf.split(b"\r\n", 1)[0]


def closed_after(sock: socket.socket) -> bool:
    try:
        while True:
            if not sock.recv(4096):
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(
    "extra",
    [(), ("--conn-limit", "1000")],
    ids=["client-limit-from-fd-limit", "out-of-file-descriptors"],
)
def test_clients_over_the_limit_are_answered_and_closed_not_left_hanging(memcached_factory, processes, extra):
    mc = memcached_factory()
    config = processes.base / "router-limit.json"
    config.write_text(json.dumps({"pools": {"p": {"servers": [mc.address]}}, "route": "PoolRoute|p"}))
    mport = free_port()
    router = processes.add(
        LimitedRouter(config, workdir=processes.base / "router-limit", metrics_port=mport, extra_args=extra)
    )
    served, refused, closed, hung = [], 0, 0, 0
    socks = []
    for _ in range(CLIENTS):
        s = socket.create_connection((router.host, router.port), timeout=5)
        s.sendall(b"version\r\n")
        socks.append(s)
    for s in socks:
        line = first_line(s)
        if line is None:
            hung += 1
            if hung > 2:
                break
        elif line.startswith(b"VERSION "):
            served.append(s)
        elif line == REFUSAL:
            assert closed_after(s), "a refused client must be closed"
            refused += 1
            s.close()
        else:
            assert line == b"", line
            closed += 1
            s.close()
    assert hung == 0, f"{hung} clients hang ({len(served)} served, {refused} refused)"
    assert len(served) >= 10 and refused >= CLIENTS // 2, (len(served), refused, closed)
    assert len(served) + refused + closed == CLIENTS
    if not extra:
        assert len(served) == 32, "the default limit: 64 fds less a reserve of 32"

    # counted, not logged per client
    c = served[0]
    c.sendall(b"stats\r\n")
    stats = {}
    conn_buf = b""
    while not conn_buf.endswith(b"END\r\n"):
        conn_buf += c.recv(65536)
    for line in conn_buf.decode().splitlines():
        if line.startswith("STAT "):
            _, name, value = line.split(" ", 2)
            stats[name] = value
    assert int(stats["rejected_connections"]) >= refused, stats
    assert int(stats["curr_connections"]) == len(served)
    log = router.log_file.read_text()
    about = [
        line
        for line in log.splitlines()
        if "accept" in line or "limit" in line or "file descriptors" in line or "Too many" in line
    ]
    assert len(about) <= 4, about

    # recovery: once clients leave, new ones are served again (and /metrics has the counter)
    for s in served:
        s.close()
    wait_for(lambda: Conn(router.address).call(b"version\r\n").startswith(b"VERSION"), what="served again")
    fresh = Conn(router.address)
    assert fresh.call(b"set k 0 0 1\r\nv\r\n") == b"STORED", "server connections still open"
    assert fresh.call(b"get k\r\n") == b"VALUE k 0 1\r\nv\r\nEND\r\n"
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as response:
        body = response.read().decode()
    rejected = next(line for line in body.splitlines() if line.startswith("squeal_router_rejected_connections_total"))
    assert int(rejected.split()[1]) >= refused
    assert "squeal_router_max_connections " + (extra[1] if extra else "32") in body
    assert "accepting new clients again" in router.log_file.read_text()
    log_lines = [line for line in router.log_file.read_text().splitlines() if "accept failed" in line]
    assert len(log_lines) <= 2, log_lines
