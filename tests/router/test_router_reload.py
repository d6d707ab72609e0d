"""Config reload keeps exactly the servers of the config that serves: a server dropped from the config
is forgotten (no more probes, not counted in stats)."""

from __future__ import annotations

import json
import signal
import socket
import threading

from ops.harness import free_port
from tests.router.conftest import FAST, Conn, furc_hash, wait_for


class CountingListener:
    """Accepts connections on a port and closes them at once, counting them (a TKO probe each)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_server(("127.0.0.1", port))
        self.sock.settimeout(0.2)
        self.count = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.count += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def stat(address: str, name: bytes) -> int:
    c = Conn(address)
    c.send(b"stats\r\n")
    value = None
    while (line := c.line()) != b"END":
        if line.split()[1] == name:
            value = int(line.split()[2])
    assert value is not None, name
    return value


def test_reload_forgets_removed_servers_and_stops_probing_them(memcached_factory, router_factory) -> None:
    alive = memcached_factory()
    port, control_port = free_port(), free_port()
    dead, control = f"127.0.0.1:{port}", f"127.0.0.1:{control_port}"
    config = {"pools": {"p": {"servers": [alive.address, dead]}}, "route": "PoolRoute|p"}
    router = router_factory(config, extra_args=FAST)
    key = next(b"k%d" % i for i in range(1000) if furc_hash(b"k%d" % i, 2) == 1)
    c = Conn(router.address)
    assert c.call(b"get " + key + b"\r\n").startswith(b"SERVER_ERROR")  # connect refused: TKO
    assert stat(router.address, b"servers_tko") == 1
    probes = CountingListener(port)  # probes now reach something that never answers `version`
    try:
        wait_for(lambda: probes.count >= 2, what="TKO probes of the dead server")
        # The new config swaps the dead server for another dead one in the same place: its probes are the
        # clock that shows the probe loop kept running long enough for the removed server to be probed.
        swapped = {"pools": {"p": {"servers": [alive.address, control]}}, "route": "PoolRoute|p"}
        router.config_path.write_text(json.dumps(swapped))
        wait_for(lambda: "reloaded" in router.log_file.read_text(), what="reload")
        assert stat(router.address, b"servers_tko") == 0
        assert c.call(b"get " + key + b"\r\n").startswith(b"SERVER_ERROR")  # the control server's TKO
        controls = CountingListener(control_port)
        try:
            wait_for(lambda: controls.count >= 1, what="the first probe of the control server")
            seen = probes.count  # (a probe of the removed server under way at the reload has landed by now)
            wait_for(lambda: controls.count >= 4, what="three more probes of the control server")
            assert probes.count == seen, f"{probes.count - seen} probes of a server no longer in the config"
        finally:
            controls.close()
    finally:
        probes.close()
    other = next(b"k%d" % i for i in range(1000) if furc_hash(b"k%d" % i, 2) == 0)
    assert c.call(b"set " + other + b" 0 0 1\r\nv\r\n") == b"STORED"
    assert Conn(alive.address).call(b"mg " + other + b" v\r\n") == b"VA 1\r\nv\r\n"


def _reload_setup(memcached_factory, router_factory):
    """A router on an ErrorRoute config that does not watch its file: only SIGHUP reloads it."""
    mc = memcached_factory()
    router = router_factory({"route": "ErrorRoute|old config"}, extra_args=("--no-config-watch",))
    new = {"pools": {"p": {"servers": [mc.address]}}, "route": "PoolRoute|p"}
    return router, new


def test_sighup_reloads_the_config(memcached_factory, router_factory) -> None:
    router, new = _reload_setup(memcached_factory, router_factory)
    c = Conn(router.address)
    router.config_path.write_text(json.dumps(new))
    # no watch: the edit is not taken until the signal
    assert c.call(b"set k 0 0 1\r\nv\r\n") == b"SERVER_ERROR old config"
    router.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: c.call(b"set k 0 0 1\r\nv\r\n") == b"STORED", what="the new route after SIGHUP")
    log = router.log_file.read_text()
    assert f"config {router.config_path} reloaded on SIGHUP (1 pools; handles: PoolRoute)" in log, log
    assert stat(router.address, b"config_loads") == 2
    router.proc.send_signal(signal.SIGHUP)  # again, unchanged: reloaded all the same, still serving
    wait_for(lambda: stat(router.address, b"config_loads") == 3, what="a second SIGHUP reload")
    assert c.call(b"get k\r\n").startswith(b"VALUE k 0 1\r\nv")
    assert router.proc.poll() is None


def test_a_broken_config_on_sighup_keeps_the_old_one(memcached_factory, router_factory) -> None:
    router, _ = _reload_setup(memcached_factory, router_factory)
    c = Conn(router.address)
    router.config_path.write_text('{\n  "pools": {},\n  "route": PoolRoute|p\n}\n')
    router.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: stat(router.address, b"config_rejects") == 1, what="the broken config rejected")
    log = router.log_file.read_text()
    rejected = [line for line in log.splitlines() if "rejected on SIGHUP, keeping the previous one" in line]
    assert rejected, log
    assert str(router.config_path) in rejected[0] and "line 3 column 12" in rejected[0], rejected[0]
    assert c.call(b"get k\r\n") == b"SERVER_ERROR old config"
    assert router.proc.poll() is None
