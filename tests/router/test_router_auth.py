"""squeal-router in front of memcached started with ascii auth (`-Y`) (issue 14, item 8b).

The router's server connections are shared by all its clients, so a client's login (a `set` whose
value is `user password`) must never reach them: the router logs in to each server connection
itself (`--upstream-auth-file`) and checks clients against its own file (`--auth-file`).
"""

from __future__ import annotations

import json

from ops.harness import Memcached, Router, memcached_command
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


def start(processes, tmp_path, router_user: str = "router:rpw", client_file: str = "alice:secret\n"):
    server_file = tmp_path / "server-auth"
    server_file.write_text("router:rpw\nadmin:apw\n")
    upstream = tmp_path / "upstream-auth"
    upstream.write_text(router_user + "\n")
    clients = tmp_path / "client-auth"
    clients.write_text(client_file)
    mc = processes.add(AuthMemcached(server_file, workdir=processes.base / "memcached"))
    config = tmp_path / "router.json"
    config.write_text(json.dumps({"pools": {"main": {"servers": [mc.address]}}, "route": "PoolRoute|main"}))
    router = processes.add(
        AuthRouter(
            config,
            workdir=processes.base / "router",
            extra_args=(
                "--upstream-auth-file", str(upstream), "--auth-file", str(clients), "--server-timeout-ms", "500"
            ),
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
    assert anon.call(b"set k 0 0 1\r\nx\r\n") == b"CLIENT_ERROR authentication failure"
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
