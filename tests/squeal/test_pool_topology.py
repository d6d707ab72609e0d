"""Pools in the topology: a region's squeal instances are workers that divide its shards (squeal/pool/), with or
without `[regions.R] squeal_pool = true` (redundant: every region with squeal instances runs them as a pool)."""

from __future__ import annotations

import pytest
from test_worker_topology import WORKERS_GOOD

import router_config
from tests.topologies import ONE_CLUSTER, on_new_ports, refused, refused_edit

POOLED = WORKERS_GOOD.replace(
    "[regions.east]\nmaster = true\n", "[regions.east]\nmaster = true\nsqueal_pool = true\n", 1
)


def test_pool_flag_loads_and_round_trips() -> None:
    assert POOLED != WORKERS_GOOD, "the test's edit must apply"
    topo = router_config.loads(POOLED)
    assert topo.region("east").squeal_pool is True
    assert topo.region("west").squeal_pool is True  # instances without the key: a pool all the same
    assert router_config.loads(WORKERS_GOOD).regions == topo.regions  # the key changes nothing
    moved = on_new_ports(topo, 42000)
    again = router_config.loads(router_config.dumps(moved))
    assert again.regions == moved.regions and again.region("east").squeal_pool is True


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        ("squeal_pool = true", 'squeal_pool = "yes"', "true or false"),
        ("squeal_pool = true", "squeal_pool = false", "always run as a pool of workers"),
    ],
)
def test_pool_flag_mistakes_name_the_key(old: str, new: str, words: str) -> None:
    error = refused(POOLED.replace(old, new, 1), "pool.toml")
    assert error.path == "regions.east.squeal_pool" and words in str(error)


def test_a_pool_needs_workers() -> None:
    error = refused_edit(
        ONE_CLUSTER,
        "[regions.east]\nmaster = true\n",
        "[regions.east]\nmaster = true\nsqueal_pool = true\n",
        "pool.toml",
    )
    assert error.path == "regions.east.squeal_pool" and "needs its workers" in str(error)


def test_squealctl_pool_commands_refuse_what_is_not_a_pool(tmp_path, capsys) -> None:
    from ops.cli import main as squealctl
    from tests.ops.deployments import TWO_REGIONS  # single daemons, no instances

    pooled, plain = tmp_path / "pool.toml", tmp_path / "plain.toml"
    pooled.write_text(POOLED)
    plain.write_text(TWO_REGIONS)
    state = ["--state-dir", str(tmp_path / "state")]
    assert squealctl([*state, "drain", "east-9", "--topology", str(pooled)]) == 2
    assert "no squeal instance 'east-9'" in capsys.readouterr().err
    assert squealctl([*state, "workers", "--topology", str(plain)]) == 2
    assert "no pooled region" in capsys.readouterr().err
    assert squealctl([*state, "move", "nosuch", "--to", "east-1", "--topology", str(pooled)]) == 2
    assert "no shard 'nosuch'" in capsys.readouterr().err


PLACED = POOLED.replace(
    "[regions.west]\n",
    "[regions.east.squeal_placement]\nthreshold = 1.3\npersist_s = 5\n"
    "cooldown_s = 0\nmax_moves = 2\nbytes_per_row = 250\nhalf_life_s = 4\n\n[regions.west]\n",
    1,
)


def test_placement_settings_load_default_and_round_trip() -> None:
    from router_config import PoolPlacement

    assert PLACED != POOLED, "the test's edit must apply"
    assert router_config.loads(POOLED).region("east").squeal_placement == PoolPlacement()  # the defaults
    topo = router_config.loads(PLACED)
    assert topo.region("east").squeal_placement == PoolPlacement(
        threshold=1.3, persist_s=5.0, cooldown_s=0.0, max_moves=2, bytes_per_row=250.0, half_life_s=4.0
    )
    again = router_config.loads(router_config.dumps(topo))
    assert again.region("east").squeal_placement == topo.region("east").squeal_placement


@pytest.mark.parametrize(
    ("old", "new", "key", "words"),
    [
        ("threshold = 1.3", "threshold = 1", "threshold", "greater than 1"),
        ("threshold = 1.3", 'threshold = "high"', "threshold", "a number"),
        ("persist_s = 5", "persist_s = -1", "persist_s", "0 or more"),
        ("cooldown_s = 0", "cooldown_s = true", "cooldown_s", "a boolean"),
        ("max_moves = 2", "max_moves = 1.5", "max_moves", "whole number"),
        ("max_moves = 2", "max_moves = -1", "max_moves", "0 (no cap)"),
        ("bytes_per_row = 250", "bytes_per_row = 0", "bytes_per_row", "greater than 0"),
        ("half_life_s = 4", "half_life_s = 0", "half_life_s", "greater than 0"),
        ("half_life_s = 4", "half_lives = 4", "half_lives", "unknown key"),
    ],
)
def test_placement_setting_mistakes_name_the_key(old: str, new: str, key: str, words: str) -> None:
    error = refused(PLACED.replace(old, new, 1), "pool.toml")
    assert error.path == f"regions.east.squeal_placement.{key}" and words in str(error)
    assert "pool.toml" in str(error)


def test_placement_settings_need_a_pool() -> None:
    from tests.ops.deployments import TWO_REGIONS  # single daemons, no instances

    error = refused_edit(
        TWO_REGIONS,
        "[regions.west]\n",
        "[regions.east.squeal_placement]\npersist_s = 5\n\n[regions.west]\n",
        "plain.toml",
    )
    assert error.path == "regions.east.squeal_placement" and "squeal_instances" in str(error)
