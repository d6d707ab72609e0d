"""Admin requests (`get __mcrouter__.*`, issue 26 item 3), answered as mcrouter's wiki page "Admin requests"
documents them, checked against where the router really puts keys: a routing prefix `/a/b/`, a
PrefixSelectorRoute, a FailoverWithExptimeRoute to a gutter pool, a FailoverRoute and a replicated AllSync
pool, all on real memcached."""

from __future__ import annotations

import hashlib
import json

from tests.router.conftest import FAST, Conn, wait_for


def admin(conn: Conn, command: str) -> str:
    """The value of `get __mcrouter__.<command>` (one VALUE block with flags 0, then END)."""
    key = f"__mcrouter__.{command}".encode()
    reply = conn.call(b"get " + key + b"\r\n")
    head, rest = reply.split(b"\r\n", 1)
    parts = head.split(b" ")
    assert parts[:3] == [b"VALUE", key, b"0"], reply
    n = int(parts[3])
    assert rest[n:] == b"\r\nEND\r\n", reply
    return rest[:n].decode()


def server_stats(mc) -> dict[str, int]:
    c = Conn(mc.address)
    try:
        c.send(b"stats\r\n")
        out = {}
        while (line := c.line()) != b"END":
            _, name, value = line.decode().split(" ", 2)
            if value.isdigit():
                out[name] = int(value)
        return out
    finally:
        c.close()


def holders(servers: list, key: bytes) -> list[int]:
    """Indexes of the servers that hold `key` (asked directly)."""
    out = []
    for i, mc in enumerate(servers):
        c = Conn(mc.address)
        if c.call(b"mg " + key + b" v\r\n").startswith(b"VA"):
            out.append(i)
        c.close()
    return out


def test_admin_requests_answer_as_mcrouter_does_and_match_real_placement(memcached_factory, router_factory):
    sizes = {"A": 3, "B": 2, "gutter": 1, "repl": 2}
    pools = {name: [memcached_factory() for _ in range(n)] for name, n in sizes.items()}
    config = {
        "pools": {name: {"servers": [mc.address for mc in mcs]} for name, mcs in pools.items()},
        "routes": [
            {
                "aliases": ["/a/b/"],
                "route": {
                    "type": "PrefixSelectorRoute",
                    "policies": {
                        "r:": "AllSyncRoute|Pool|repl",
                        "f:": {"type": "FailoverRoute", "children": ["PoolRoute|B", "PoolRoute|gutter"]},
                    },
                    "wildcard": {
                        "type": "FailoverWithExptimeRoute",
                        "normal": "PoolRoute|A",
                        "failover": "PoolRoute|gutter",
                        "failover_exptime": 10,
                    },
                },
            },
            {"aliases": ["/a/c/"], "route": "PoolRoute|B"},
        ],
    }
    router = router_factory(config, extra_args=FAST)
    c = Conn(router.address)
    addr = {name: [mc.address for mc in mcs] for name, mcs in pools.items()}
    keys = [f"user:{i}" for i in range(12)]

    # -- route: answered before any request reached a server, and nothing is sent by it
    predicted = {k: admin(c, f"route(set,/a/b/{k})") for k in keys}
    predicted_repl = admin(c, "route(set,/a/b/r:1)")
    predicted_f = admin(c, "route(delete,/a/b/f:1)")
    predicted_c = admin(c, "route(get,/a/c/x1)")
    for mcs in pools.values():
        for mc in mcs:
            st = server_stats(mc)
            assert (st["cmd_get"], st["cmd_set"], st["delete_hits"] + st["delete_misses"]) == (0, 0, 0), mc.address
    assert predicted_repl == "\r\n".join(addr["repl"]), predicted_repl
    assert predicted_f in addr["B"], predicted_f

    # ... and it is where the router really puts them
    for k in keys:
        assert c.call(f"set /a/b/{k} 0 0 1\r\nv\r\n".encode()) == b"STORED"
        assert [addr["A"][i] for i in holders(pools["A"], k.encode())] == [predicted[k]], k
        assert holders(pools["gutter"], k.encode()) == []
    assert c.call(b"set /a/b/r:1 0 0 1\r\nv\r\n") == b"STORED"
    assert holders(pools["repl"], b"r:1") == [0, 1]
    assert c.call(b"set /a/c/x1 0 0 1\r\nv\r\n") == b"STORED"
    assert [addr["B"][i] for i in holders(pools["B"], b"x1")] == [predicted_c]
    assert len(set(predicted.values())) > 1, "the keys should spread over pool A"

    # -- route_handles: the tree the request traverses, one handle a line, a space per level
    tree = admin(c, f"route_handles(get,/a/b/{keys[0]})").split("\n")
    a_id = addr["A"].index(predicted[keys[0]])
    assert tree == [
        "prefix-selector",
        " failover-with-exptime",
        "  hash|Ch3",
        f"   host|pool=A|id={a_id}|ap={predicted[keys[0]]}:ascii:plain:notcompressed|timeout=300ms"
        "|keep_routing_prefix=false",
        "  hash|Ch3",
        f"   host|pool=gutter|id=0|ap={addr['gutter'][0]}:ascii:plain:notcompressed|timeout=300ms"
        "|keep_routing_prefix=false",
    ], tree
    repl_tree = admin(c, "route_handles(set,/a/b/r:1)").split("\n")
    assert repl_tree[:2] == ["prefix-selector", " all-sync"] and len(repl_tree) == 4, repl_tree
    assert [line.split("|")[2] for line in repl_tree[2:]] == ["id=0", "id=1"]

    # -- failover: with the key's server down (and found TKO), route names gutter, and so does a real set
    victim_key = keys[0]
    victim = pools["A"][a_id]
    victim.stop()
    assert c.call(f"get /a/b/{victim_key}\r\n".encode()) == b"END"  # connect error: TKO, gutter answers
    wait_for(lambda: admin(c, f"route(set,/a/b/{victim_key})") == addr["gutter"][0], what="route names gutter")
    assert c.call(f"set /a/b/{victim_key} 0 0 1\r\nw\r\n".encode()) == b"STORED"
    assert holders(pools["gutter"], victim_key.encode()) == [0]
    other = next(k for k in keys if predicted[k] != victim.address)
    assert admin(c, f"route(set,/a/b/{other})") == predicted[other], "keys of live servers stay put"

    # -- the other commands
    version = c.call(b"version\r\n").decode()
    assert admin(c, "version") == version.removeprefix("VERSION ")
    text = router.config_path.read_bytes()
    md5 = hashlib.md5(text).hexdigest()
    assert admin(c, "config_md5_digest") == md5
    sources = admin(c, "config_sources_info")
    assert json.loads(sources) == {"config_file": str(router.config_path.resolve()), "mcrouter_config": md5}
    assert sources.startswith('{\n  "config_file": '), sources  # folly's pretty, sorted JSON
    options = dict(line.split(" ", 1) for line in admin(c, "options").split("\n"))
    assert options["port"] == str(router.port) and options["server_timeout_ms"] == "300", options
    assert admin(c, "options(port)") == str(router.port)
    assert admin(c, "options(nope)") == "ERROR: options: option nope not found"
    assert admin(c, "nope") == "ERROR: unknown command: nope"
    assert admin(c, "route(frob,k)") == "ERROR: route: unknown request frob"
    assert admin(c, "route(set)") == "ERROR: route: 2 args expected"
    assert admin(c, "config_file") == str(router.config_path.resolve())
    # an admin key among ordinary keys of a multi-get keeps its place
    reply = c.call(f"get /a/b/{other} __mcrouter__.version /a/b/{other}\r\n".encode())
    assert reply.count(b"VALUE ") == 3 and b"VALUE __mcrouter__.version 0 " in reply.split(b"\r\n")[2], reply
    c.close()
