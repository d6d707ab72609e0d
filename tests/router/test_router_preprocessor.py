"""mcrouter's config preprocessor (macros, constants, @import, built-ins) in the real router binary,
and `squeal-router-config`, which checks or expands a config without serving it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.router.conftest import ROUTER_BIN, Conn

CONFIG_BIN = ROUTER_BIN.parent / "squeal-router-config"

# Two pools built by one macro; the pool list itself comes from a file next to the config.
MACRO_CONFIG = """
// as mcrouter's wiki writes them
{
  "macros": {
    "pool": {"type": "macroDef", "params": ["addr", {"name": "timeout", "default": 200}],
             "result": {"servers": ["%addr%"], "server_timeout": "%timeout%"}},
    "hot_prefix": {"type": "constDef", "result": "hot:"},
  },
  "pools": {
    "vars": {"addrs": "@import(servers.json)"},
    "cold": "@pool(@select(%addrs%, cold))",
    "hot": {"type": "pool", "addr": "@select(%addrs%, hot)", "timeout": "@int(500)"},
  },
  "route": {
    "type": "PrefixSelectorRoute",
    "policies": {
      "@str(%hot_prefix%)": "PoolRoute|hot",
    },
    "wildcard": "@if(@defined(no_such_const), ErrorRoute, PoolRoute|cold)",
  },
}
"""


def mc_get(address: str, key: str) -> bytes:
    c = Conn(address)
    try:
        return c.call(f"get {key}\r\n".encode())
    finally:
        c.close()


def test_a_config_written_with_macros_and_an_import_routes_like_its_expansion(
    memcached_factory, router_factory, tmp_path: Path
) -> None:
    cold, hot = memcached_factory(), memcached_factory()
    (tmp_path / "servers.json").write_text(json.dumps({"cold": cold.address, "hot": hot.address}))
    path = tmp_path / "macros.json"
    path.write_text(MACRO_CONFIG)
    router = router_factory(path)
    c = Conn(router.address)
    assert c.call(b"set hot:a 0 0 1\r\nh\r\n") == b"STORED"
    assert c.call(b"set other 0 0 1\r\nc\r\n") == b"STORED"
    assert mc_get(hot.address, "hot:a").startswith(b"VALUE hot:a 0 1")
    assert mc_get(cold.address, "other").startswith(b"VALUE other 0 1")
    assert mc_get(cold.address, "hot:a") == b"END"

    expanded = subprocess.run([CONFIG_BIN, "--expand", path], capture_output=True, text=True, check=True)
    plain = json.loads(expanded.stdout)
    assert "macros" not in plain
    assert plain["pools"]["hot"] == {"servers": [hot.address], "server_timeout": 500}
    assert plain["pools"]["cold"] == {"servers": [cold.address], "server_timeout": 200}
    assert plain["route"]["policies"] == {"hot:": "PoolRoute|hot"}
    checked = subprocess.run([CONFIG_BIN, path], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert "loads (2 pools" in checked.stdout, checked.stdout


def test_a_macro_that_fails_is_refused_with_where_and_why(router_factory, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"pools": {}, "route": {"type": "PrefixSelectorRoute", "policies": {"a:": "@int(abc)"}}}')
    checked = subprocess.run([CONFIG_BIN, bad], capture_output=True, text=True)
    assert checked.returncode == 1
    assert f"{bad}: preprocessor: route: policies: a:: @int" in checked.stderr, checked.stderr
    assert 'cannot make a string ("abc") an integer' in checked.stderr, checked.stderr

    missing = tmp_path / "missing.json"
    missing.write_text('{"pools": "@import(nowhere.json)", "route": "NullRoute"}')
    checked = subprocess.run([CONFIG_BIN, missing], capture_output=True, text=True)
    assert checked.returncode == 1
    assert "nowhere.json" in checked.stderr and "cannot read" in checked.stderr, checked.stderr

    # the router itself refuses it at start with the same reason, naming the file
    proc = subprocess.run(
        [ROUTER_BIN, "-f", bad, "-p", "0", "--no-config-watch"], capture_output=True, text=True, timeout=20
    )
    assert proc.returncode != 0
    assert "preprocessor: route: policies: a:: @int" in proc.stderr, proc.stderr


def test_config_params_are_constants_and_a_bad_one_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "params.json"
    path.write_text('{"pools": {}, "route": "%which%"}')
    out = subprocess.run(
        [CONFIG_BIN, "--expand", "--config-params", "which:NullRoute", path], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["route"] == "NullRoute"
    out = subprocess.run([CONFIG_BIN, "--config-params", "nocolon", path], capture_output=True, text=True)
    assert out.returncode == 1 and "--config-params: `nocolon` is not name:value" in out.stderr, out.stderr


def test_config_params_reach_the_router_and_the_check_as_mcrouters_harness_passes_them(
    memcached_factory, router_factory, tmp_path: Path
) -> None:
    """mcrouter's own test_config_params.json: the port and the pool name come from --config-params
    (before, only `--expand` passed them on: the check and the router refused the config)."""
    mc = memcached_factory()
    path = tmp_path / "params.json"
    path.write_text('{"pools": {"A": {"servers": ["127.0.0.1:%PORT%"]}}, "route": "PoolRoute|%POOL%"}')
    params = f"PORT:{mc.port},POOL:A"
    checked = subprocess.run([CONFIG_BIN, "--config-params", params, path], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    router = router_factory(path, extra_args=("--config-params", params))
    c = Conn(router.address)
    assert c.call(b"set key 0 0 5\r\nvalue\r\n") == b"STORED"
    assert mc_get(mc.address, "key") == b"VALUE key 0 5\r\nvalue\r\nEND\r\n"
    c.close()
    bad = subprocess.run([ROUTER_BIN, "--config-file", path, "-p", "1", "--config-params", "x"], capture_output=True)
    assert bad.returncode == 2 and b"`x` is not name:value" in bad.stderr, bad.stderr
