"""squeal-router in front of memcached started with ascii auth (`-Y`) (issue 14, item 8b).

The router's server connections are shared by all its clients, so a client's login (a `set` whose
value is `user password`) must never reach them: the router logs in to each server connection
itself (`--upstream-auth-file`) and checks clients against its own file (`--auth-file`). Without
`--upstream-auth-file` it finds out that a server wants a login when it opens a connection to it, and
sends that connection nothing else.
"""

from __future__ import annotations

import json

from ops.harness import Memcached, Router, memcached_command, wait_until
from tests.router.conftest import Conn


class AuthMemcached(Memcached):
    def __init__(self, auth_file, **kwargs) -> None:
        super().__init__(**kwargs)
        self.auth_file = auth_file

    def command(self) -> list[str]:
        return super().command() + ["-Y", str(self.auth_file)]

    def ready(self) -> bool:
        return memcached_command((self.host, self.port), b"version\r\n").startswith(b"CLIENT_ERROR unauthenticated")


class AuthRouter(Router):
    def ready(self) -> bool:
        reply = memcached_command((self.host, self.port), b"version\r\n")
        return reply.startswith(b"CLIENT_ERROR unauthenticated") or reply.startswith(b"VERSION")


def start(
    processes,
    tmp_path,
    router_user: str = "router:rpw",
    client_file: str = "alice:secret\n",
    credentials: bool = True,
    extra_args: tuple[str, ...] = (),
):
    """memcached -Y behind a router; `credentials=False` starts the router without either auth file."""
    server_file = tmp_path / "server-auth"
    server_file.write_text("router:rpw\nadmin:apw\n")
    upstream = tmp_path / "upstream-auth"
    upstream.write_text(router_user + "\n")
    clients = tmp_path / "client-auth"
    clients.write_text(client_file)
    mc = processes.add(AuthMemcached(server_file, workdir=processes.base / "memcached"))
    config = tmp_path / "router.json"
    config.write_text(json.dumps({"pools": {"main": {"servers": [mc.address]}}, "route": "PoolRoute|main"}))
    auth_args = ("--upstream-auth-file", str(upstream), "--auth-file", str(clients)) if credentials else ()
    router = processes.add(
        AuthRouter(
            config,
            workdir=processes.base / "router",
            extra_args=(*auth_args, "--server-timeout-ms", "500", *extra_args),
        )
    )
    return mc, router


def admin(mc) -> Conn:
    c = Conn(mc.address)
    assert c.call(b"set login 0 0 9\r\nadmin apw\r\n") == b"STORED"
    return c


def test_one_clients_login_never_authenticates_other_clients(processes, tmp_path) -> None:
    mc, router = start(processes, tmp_path)
    anon = Conn(router.address)
    # not logged in: refused by the router, as memcached -Y refuses it
    assert anon.call(b"get k\r\n") == b"CLIENT_ERROR unauthenticated"
    assert anon.call(b"set k 0 0 1\r\nx\r\n") == b"CLIENT_ERROR bad authentication token format"
    assert anon.call(b"set k 0 0 9\r\nalice bad\r\n") == b"CLIENT_ERROR authentication failure"
    # the server's own credentials are not a client login at the router
    assert anon.call(b"set k 0 0 10\r\nrouter rpw\r\n") == b"CLIENT_ERROR authentication failure"

    alice = Conn(router.address)
    assert alice.call(b"set login-key 0 0 12\r\nalice secret\r\n") == b"STORED"
    assert alice.call(b"set k 0 0 1\r\nv\r\n") == b"STORED"
    assert alice.call(b"get k\r\n") == b"VALUE k 0 1\r\nv\r\nEND\r\n"
    assert alice.call(b"mg k v\r\n") == b"VA 1\r\nv\r\n"

    # alice's login did not log anyone else in, on the router or through its server connection
    assert anon.call(b"get k\r\n") == b"CLIENT_ERROR unauthenticated"
    other = Conn(router.address)
    assert other.call(b"get k\r\n") == b"CLIENT_ERROR unauthenticated"
    assert other.call(b"delete k\r\n") == b"CLIENT_ERROR unauthenticated"

    # nothing of a login reached the server: its key was never stored there
    direct = admin(mc)
    assert direct.call(b"get login-key\r\n") == b"END"
    assert direct.call(b"get k\r\n") == b"VALUE k 0 1\r\nv\r\nEND\r\n"


LOGIN_VALUES = [
    b"admin apw",
    b"admin bad",
    b"x",
    b"",
    b"admin  apw",
    b"  admin apw",
    b"admin apw ",
    b"admin apw extra",
    b"admin ",
    b" apw",
    b"admin\tapw",
    b"admin apw\r",
    b"a b c",
]


def test_client_logins_are_answered_byte_for_byte_as_memcached_answers_them(processes, tmp_path) -> None:
    """The router's --auth-file against memcached -Y with the same account: every login value, on a
    fresh connection to each, gets the same answer, and so does the command after it."""
    mc, router = start(processes, tmp_path, client_file="admin:apw\n")
    for value in LOGIN_VALUES:
        for noreply in (b"", b" noreply"):
            login = b"set login 0 0 %d%s\r\n%s\r\n" % (len(value), noreply, value)
            answers = []
            for address in (mc.address, router.address):
                c = Conn(address)
                answers.append((c.call(login), c.call(b"mn\r\n")))
            assert answers[1] == answers[0], f"{login!r}: router {answers[1]}, memcached {answers[0]}"


def test_a_wrong_upstream_login_sends_nothing_to_the_server(processes, tmp_path) -> None:
    mc, router = start(processes, tmp_path, router_user="router:wrong")
    alice = Conn(router.address)
    assert alice.call(b"set login-key 0 0 12\r\nalice secret\r\n") == b"STORED"
    reply = alice.call(b"set k 0 0 1\r\nv\r\n")
    assert reply.startswith(b"SERVER_ERROR"), reply
    assert b"upstream login refused" in reply or b"tko" in reply, reply
    direct = admin(mc)
    assert direct.call(b"get k\r\n") == b"END"
    assert direct.call(b"get login-key\r\n") == b"END"


def total_connections(server: Conn) -> int:
    """memcached's `total_connections`: every connection it accepted, asked on a logged-in connection."""
    server.send(b"stats\r\n")
    stats = {}
    while (line := server.line()) != b"END":
        _, name, value = line.decode().split(" ", 2)
        stats[name] = value
    return int(stats["total_connections"])


def login_errors(router, mc) -> list[str]:
    """The router's ERROR lines that name the server and say to use --upstream-auth-file (the TKO
    line that follows each gives the same reason; it is not counted)."""
    return [
        line
        for line in router.log_file.read_text(errors="replace").splitlines()
        if "ERROR:" in line and mc.address in line and "--upstream-auth-file" in line
    ]


FAST_PROBES = ("--probe-delay-initial-ms", "100", "--probe-delay-max-ms", "200")


def test_without_upstream_credentials_a_clients_login_never_reaches_the_server(processes, tmp_path) -> None:
    mc, router = start(processes, tmp_path, credentials=False, extra_args=FAST_PROBES)
    a = Conn(router.address)
    # a valid login for the server: had it reached the shared server connection, that connection
    # would be logged in for every client of the router
    reply = a.call(b"set login-key 0 0 10\r\nrouter rpw\r\n")
    assert reply.startswith(b"SERVER_ERROR"), reply

    b = Conn(router.address)
    for request in (b"set k 0 0 1\r\nv\r\n", b"get k\r\n", b"mg k v\r\n", b"set k 0 0 1\r\nw\r\n"):
        reply = b.call(request)
        assert reply.startswith(b"SERVER_ERROR"), (request, reply)
    assert a.call(b"get login-key\r\n").startswith(b"SERVER_ERROR")

    # nothing of either client reached the server
    direct = admin(mc)
    assert direct.call(b"get login-key\r\n") == b"END"
    assert direct.call(b"get k\r\n") == b"END"

    # the operator is told which server and what to do: once, not per request nor per probe
    wait_until(lambda: login_errors(router, mc), 5.0, "the router to log the missing --upstream-auth-file")
    # each probe (every 100-200 ms) is a new connection to the server, finding the same: wait for five of them
    logged_at = total_connections(direct)
    wait_until(lambda: total_connections(direct) >= logged_at + 5, 10.0, "five probes after the first log line")
    assert b.call(b"get k\r\n").startswith(b"SERVER_ERROR")
    assert len(login_errors(router, mc)) == 1, login_errors(router, mc)


def test_without_upstream_credentials_a_server_without_auth_is_served_and_a_new_login_demand_is_logged(
    processes, tmp_path
) -> None:
    mc, router = start(processes, tmp_path, credentials=False, extra_args=FAST_PROBES)
    c = Conn(router.address)

    def refused_and_logged(times: int) -> bool:
        return c.call(b"get k\r\n").startswith(b"SERVER_ERROR") and len(login_errors(router, mc)) == times

    wait_until(lambda: refused_and_logged(1), 5.0, "the router to refuse the -Y server and log it")

    # the same address without -Y: the prober finds it back and the router serves it
    mc.kill()
    plain = processes.add(Memcached(port=mc.port, workdir=processes.base / "plain"))
    wait_until(lambda: c.call(b"set k 0 0 1\r\nv\r\n") == b"STORED", 10.0, "the router to serve the plain server")
    assert c.call(b"get k\r\n") == b"VALUE k 0 1\r\nv\r\nEND\r\n"

    # -Y again: found when the router reconnects, and logged again (a new change)
    plain.kill()
    processes.add(AuthMemcached(mc.auth_file, port=mc.port, workdir=processes.base / "memcached2"))
    wait_until(lambda: refused_and_logged(2), 10.0, "the router to refuse the -Y server again and log it")
    assert direct_get(mc, b"k") == b"END"


def direct_get(mc, key: bytes) -> bytes:
    return admin(mc).call(b"get " + key + b"\r\n")
