"""Router configs emitted from the example topology: golden files and handle coverage."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import router_config

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden" / "router-configs-local.json"
EXAMPLE = HERE.parent / "examples" / "local.toml"

ROUTER_SRC = HERE.parent / "router" / "src"


def router_handles() -> set[str]:
    """The route handles squeal-router implements: the `name` of every entry of its registry (`HANDLES` in
    router/src/registry.rs, `module::CONST` each, the const beside its handle's `build` in routes/<module>.rs),
    read from the source so the list cannot go stale."""
    text = (ROUTER_SRC / "registry.rs").read_text()
    start = text.index("pub const HANDLES: &[Handle] = &[")
    entries = re.findall(r"^\s*(\w+)::(\w+),", text[start : text.index("\n];", start)], re.MULTILINE)
    names = []
    for module, const in entries:
        source = (ROUTER_SRC / "routes" / f"{module}.rs").read_text()
        at = source.index(f"pub const {const}: Handle = Handle {{")
        names.append(re.search(r'name:\s*"(\w+)"', source[at:]).group(1))  # type: ignore[union-attr]
    assert len(names) == len(set(names)) == len(entries) > 0, names  # one name per entry, no repeats
    return set(names)


def test_example_configs_match_golden_file():
    """Regenerate with SQUEAL_UPDATE_GOLDEN=1 after an intended change, and review the diff."""
    rendered = router_config.render(router_config.all_cluster_configs(router_config.load(EXAMPLE)))
    if os.environ.get("SQUEAL_UPDATE_GOLDEN"):
        GOLDEN.write_text(rendered)
    assert rendered == GOLDEN.read_text()


def test_every_emitted_handle_is_one_the_router_implements():
    configs = router_config.all_cluster_configs(router_config.load(EXAMPLE))
    used = set().union(*(router_config.handle_types(c["route"]) for c in configs.values()))
    assert used <= router_config.EMITTED_HANDLES
    assert router_config.EMITTED_HANDLES <= router_handles()


def test_the_handle_list_comes_from_the_router_registry():
    handles = router_handles()
    assert {"PoolRoute", "WarmUpRoute", "FailoverWithExptimeRoute", "BlackholeRoute"} <= handles
    assert len(handles) >= 27  # every handle of the registry, not a hand-kept subset


def test_every_pool_reference_exists():
    for name, config in router_config.all_cluster_configs(router_config.load(EXAMPLE)).items():
        text = json.dumps(config["route"])
        for pool in config["pools"]:
            assert config["pools"][pool]["servers"], f"{name}: empty pool {pool}"
        refs = {s.split("|", 1)[1] for s in _strings(config["route"]) if "|" in s}
        assert refs <= set(config["pools"]), f"{name}: unknown pools {refs - set(config['pools'])} in {text}"


def test_gutter_caps_ttl_and_cold_cluster_reads_from_warm():
    topo = router_config.loads(
        EXAMPLE.read_text().replace(
            'routers = ["127.0.0.1:31200"]', 'routers = ["127.0.0.1:31200"]\ncold = { warm_cluster = "east-a" }'
        )
    )
    config = router_config.cluster_config(topo, "east-b")
    leases = config["route"]["wildcard"]  # the example's wildcard pools have leases: the outermost handle
    assert leases["type"] == "TransparentLeaseRoute" and leases["lease_ttl"] == 10
    warm_up = leases["target"]
    assert warm_up["type"] == "WarmUpRoute"
    assert warm_up["cold"]["type"] == "FailoverWithExptimeRoute"
    assert warm_up["cold"]["failover_exptime"] == 10
    assert config["pools"][warm_up["warm"].split("|")[1]]["servers"] == ["127.0.0.1:31101", "127.0.0.1:31102"]


def test_replicated_pool_reads_go_through_the_load_balancer_writes_to_all():
    """Reads: LoadBalancerRoute over the replicas (squeal-router chooses by measured load; a real
    mcrouter hashes the key), failing over to every other replica; writes and deletes: AllSyncRoute."""
    topo = router_config.load(EXAMPLE)
    for cluster in ("east-a", "east-b"):
        config = router_config.cluster_config(topo, cluster)
        route = config["route"]["policies"]["session:"]
        assert route["default_policy"] == {
            "type": "LoadBalancerRoute",
            "children": "Pool|sessions",
            "failover_count": 2,
            "load_ttl_ms": 1000,
        }
        assert route["operation_policies"]["delete"] == {"type": "AllSyncRoute", "children": "Pool|sessions"}
        assert set(route["operation_policies"]) >= {"set", "add", "delete", "incr", "touch", "cas"}
        assert [p for p in config["pools"] if p.startswith("sessions")] == ["sessions"]


def _strings(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
