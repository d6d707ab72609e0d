"""squeal through the real squeal-router: deletes reach keys hashed across a cluster's pool and the regional pool."""

from __future__ import annotations

import json

import pytest
from squeal_helpers import Cache, create_schema, unique_db, wait_gone, wait_until, write_topology

import router_config
from ops.harness import ROUTER_BIN, HarnessError, Memcached, Router, SquealDaemon, free_port, memcached_command
from tests.binaries import needs_binary


def _router_works() -> bool:
    """The binary exists and is the real proxy (not a build placeholder)."""
    if not ROUTER_BIN.exists():
        return False
    import subprocess

    out = subprocess.run([str(ROUTER_BIN), "--help"], capture_output=True, text=True, timeout=10)
    return "--config-file" in out.stdout + out.stderr


pytestmark = needs_binary(_router_works(), f"{ROUTER_BIN} is not built (or not the real router yet)")


def _topology(schema: str, primary, mc: dict, r0: int, r1: int, rule_extra: str = "") -> str:
    return (
        f'[squeal]\ndatamarker_dir = "dm"\nmetrics_port_base = {free_port()}\n'
        f'[[rules]]\ntable = "{schema}.users"\nkeys = ["user:{{id}}", "user:email:{{email}}"]\n{rule_extra}'
        f"[regions.east]\nmaster = true\n"
        f'database = {{ role = "primary", host = "127.0.0.1", port = {primary.port}, server_id = 1 }}\n'
        f'regional_pool = {{ servers = ["127.0.0.1:{mc["regional"].port}"], prefixes = ["regional:"] }}\n'
        f'[regions.east.clusters.c0]\nrouters = ["127.0.0.1:{r0}"]\n'
        f'pools.wildcard = {{ servers = ["127.0.0.1:{mc["w0"].port}", "127.0.0.1:{mc["w1"].port}"] }}\n'
        f'[regions.east.clusters.c1]\nrouters = ["127.0.0.1:{r1}"]\n'
        f'pools.wildcard = {{ servers = ["127.0.0.1:{mc["w2"].port}"] }}\n'
    )


def test_invalidation_through_routers(primary, tmp_path) -> None:
    schema = unique_db("router")
    create_schema(primary, schema)
    mc = {name: Memcached(workdir=tmp_path / "mc").start() for name in ("w0", "w1", "w2", "regional")}
    r0, r1 = free_port(), free_port()
    text = _topology(schema, primary, mc, r0, r1)
    topo_path = write_topology(tmp_path / "topology.toml", text)
    topo = router_config.load(topo_path)
    procs = list(mc.values())
    try:
        for name, port in (("c0", r0), ("c1", r1)):
            cfg = tmp_path / f"{name}.json"
            cfg.write_text(json.dumps(router_config.cluster_config(topo, name)))
            try:
                procs.append(Router(cfg, port=port, workdir=tmp_path / name).start())
            except HarnessError as e:
                pytest.fail(f"router for {name} did not start: {e}")
        daemon = SquealDaemon(topo_path, "east", workdir=tmp_path / "squeal", state_dir=tmp_path / "state")
        procs.append(daemon.start())
        via = [Cache(r0), Cache(r1)]
        keys = [f"user:{i}" for i in range(1, 41)] + ["user:email:a@x"]
        for c in via:
            c.set_many(keys + ["regional:1"])
        # The keys really are spread over c0's two memcacheds (so the router did the routing).
        assert Cache(mc["w0"].port).present(keys) and Cache(mc["w1"].port).present(keys)
        rows = ", ".join(f"({i}, {chr(39) + 'a@x' + chr(39) if i == 1 else 'NULL'}, 'n')" for i in range(1, 41))
        primary.execute(f"INSERT INTO {schema}.users VALUES {rows} /* mcd:regional:1 */")
        wait_gone(via, keys)
        wait_gone([Cache(mc["regional"].port)], ["regional:1"])
        assert memcached_command(("127.0.0.1", r0), b"mn\r\n") == b"MN"
    finally:
        for p in reversed(procs):
            p.stop(grace=5)


def test_truncate_flush_policy_through_routers_never_acknowledges_a_refused_flush(primary, tmp_path) -> None:
    """on_truncate = "flush": squeal flushes each cluster through its routers (--enable-flush-cmd); a router
    that refuses flush_all is retried, never taken as done."""
    schema = unique_db("rflush")
    create_schema(primary, schema)
    mc = {name: Memcached(workdir=tmp_path / "mc").start() for name in ("w0", "w1", "w2", "regional")}
    r0, r1 = free_port(), free_port()
    topo_path = write_topology(
        tmp_path / "topology.toml", _topology(schema, primary, mc, r0, r1, rule_extra='on_truncate = "flush"\n')
    )
    topo = router_config.load(topo_path)
    procs: list = list(mc.values())
    routers: dict[str, Router] = {}

    def start_router(name: str, port: int, *flags: str) -> None:
        cfg = tmp_path / f"{name}.json"
        cfg.write_text(json.dumps(router_config.cluster_config(topo, name)))
        routers[name] = Router(cfg, port=port, workdir=tmp_path / name, extra_args=flags).start()
        procs.append(routers[name])

    try:
        start_router("c0", r0)  # refuses flush_all
        start_router("c1", r1, "--enable-flush-cmd")
        daemon = SquealDaemon(topo_path, "east", workdir=tmp_path / "squeal", state_dir=tmp_path / "state")
        procs.append(daemon.start())
        via = [Cache(r0), Cache(r1)]
        keys = [f"unrelated:{i}" for i in range(30)]
        for c in via:
            c.set_many(keys)
        primary.execute(f"TRUNCATE TABLE {schema}.users")
        wait_gone([via[1]], keys)  # c1 flushed
        wait_until(lambda: "flush_all refused" in daemon.log_file.read_text(), 10, "the refusal to be logged")
        assert via[0].present(keys) == set(keys)  # c0's refusal was not taken for a flush...
        routers["c0"].stop()
        start_router("c0", r0, "--enable-flush-cmd")
        wait_gone([Cache(r0)], keys, timeout=20)  # ...it is retried until the router does it
        assert not Cache(mc["w0"].port).present(keys) and not Cache(mc["w1"].port).present(keys)
    finally:
        for p in reversed(procs):
            p.stop(grace=5)
