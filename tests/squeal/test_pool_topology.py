"""Pool mode in the topology: `[regions.R] squeal_pool = true` makes the region's squeal instances workers that
divide its shards (squeal/pool.py); without it they elect one leader as before (squeal/ha.py)."""

from __future__ import annotations

import itertools

import pytest
from test_ha_topology import HA_GOOD

import router_config
from router_config import TopologyError

POOLED = HA_GOOD.replace("[regions.east]\nmaster = true\n", "[regions.east]\nmaster = true\nsqueal_pool = true\n", 1)


def test_pool_flag_loads_and_round_trips() -> None:
    assert POOLED != HA_GOOD, "the test's edit must apply"
    topo = router_config.loads(POOLED)
    assert topo.region("east").squeal_pool is True
    assert topo.region("west").squeal_pool is False  # the other region keeps its leader election
    assert router_config.loads(HA_GOOD).region("east").squeal_pool is False  # the default: today's HA mode
    ports = itertools.count(42000)
    moved = router_config.reassign_ports(topo, lambda: next(ports))
    again = router_config.loads(router_config.dumps(moved))
    assert again.regions == moved.regions and again.region("east").squeal_pool is True


@pytest.mark.parametrize(("old", "new", "words"), [
    ("squeal_pool = true", 'squeal_pool = "yes"', "true or false"),
])
def test_pool_flag_mistakes_name_the_key(old: str, new: str, words: str) -> None:
    with pytest.raises(TopologyError) as info:
        router_config.loads(POOLED.replace(old, new, 1), source="pool.toml")
    assert info.value.path == "regions.east.squeal_pool" and words in str(info.value)


def test_a_pool_needs_workers() -> None:
    text = """
[[rules]]
table = "app.users"
keys = ["user:{id}"]

[regions.east]
master = true
squeal_pool = true
database = { role = "primary", port = 33306, server_id = 1 }

[regions.east.clusters.a]
routers = ["127.0.0.1:5000"]
pools.wildcard = { servers = ["127.0.0.1:5001"] }
"""
    with pytest.raises(TopologyError) as info:
        router_config.loads(text, source="pool.toml")
    assert info.value.path == "regions.east.squeal_pool" and "needs its workers" in str(info.value)


def test_squealctl_pool_commands_refuse_what_is_not_a_pool(tmp_path, capsys) -> None:
    from ops.cli import main as squealctl

    pooled, plain = tmp_path / "pool.toml", tmp_path / "ha.toml"
    pooled.write_text(POOLED)
    plain.write_text(HA_GOOD)
    state = ["--state-dir", str(tmp_path / "state")]
    assert squealctl([*state, "drain", "east-9", "--topology", str(pooled)]) == 2
    assert "no squeal instance 'east-9'" in capsys.readouterr().err
    assert squealctl([*state, "drain", "west-1", "--topology", str(pooled)]) == 2  # west elects a leader
    assert "no pooled region for west-1" in capsys.readouterr().err
    assert squealctl([*state, "workers", "--topology", str(plain)]) == 2
    assert "no pooled region" in capsys.readouterr().err
    assert squealctl([*state, "move", "nosuch", "--to", "east-1", "--topology", str(pooled)]) == 2
    assert "no shard 'nosuch'" in capsys.readouterr().err
