"""monitoring.leaders from the instances' /healthz answers (given here; the HA and pool deployment tests ask real
instances): who leads an HA region, and which instance delivers each shard - the leader every one, a pool's
workers the ones they own - with the shards nobody delivers named."""

from __future__ import annotations

from typing import Any

import router_config
from monitoring.leaders import leaders

TOPOLOGY = """
[zookeeper]
servers = ["127.0.0.1:2181"]

[shards.p0]
gtid_domain_id = 10
east = { port = 3400, server_id = 40 }
west = { port = 3500, server_id = 50 }
[shards.p1]
gtid_domain_id = 11
east = { port = 3401, server_id = 41 }
west = { port = 3501, server_id = 51 }
[shards.p2]
gtid_domain_id = 12
east = { port = 3402, server_id = 42 }
west = { port = 3502, server_id = 52 }

[[rules]]
table = "app.users"
keys = ["user:{id}"]

[regions.east]
master = true
[[regions.east.squeal_instances]]
name = "east-1"
metrics_port = 19110
[[regions.east.squeal_instances]]
name = "east-2"
metrics_port = 19111
[regions.east.clusters.a]
routers = ["127.0.0.1:7001"]
pools.wildcard = { servers = ["127.0.0.1:7002"] }

[regions.west]
squeal_pool = true
[[regions.west.squeal_instances]]
name = "w1"
metrics_port = 19210
[[regions.west.squeal_instances]]
name = "w2"
metrics_port = 19211
[[regions.west.squeal_instances]]
name = "w3"
metrics_port = 19212
[regions.west.clusters.b]
routers = ["127.0.0.1:7101"]
pools.wildcard = { servers = ["127.0.0.1:7102"] }
"""


def test_owners_of_every_shard_in_an_ha_region_and_a_pool() -> None:
    topo = router_config.loads(TOPOLOGY)
    answers: dict[str, dict[str, Any] | None] = {
        "127.0.0.1:19110": {"state": "standby", "ha": {"leader": "east-2"}},
        "127.0.0.1:19111": {"state": "leader", "takeover": {"since": 1700000000.0}},
        "127.0.0.1:19210": {"state": "worker", "owns": ["p2", "p0"]},
        "127.0.0.1:19211": {"state": "worker", "owns": []},
        "127.0.0.1:19212": None,  # down
    }
    east, west = leaders(topo, health=lambda address: answers[address])
    assert (east["region"], east["pool"], east["leader"], east["since"]) == ("east", False, "east-2", 1700000000.0)
    assert east["standbys"] == ["east-1"]
    assert east["owners"] == {"p0": "east-2", "p1": "east-2", "p2": "east-2"} and east["unowned"] == []
    assert (west["region"], west["pool"], west["leader"], west["standbys"]) == ("west", True, None, [])
    assert west["owners"] == {"p0": "w1", "p2": "w1"} and west["unowned"] == ["p1"]
    assert [(i["name"], i["state"], i["owns"]) for i in west["instances"]] == [
        ("w1", "worker", ["p0", "p2"]),
        ("w2", "worker", []),
        ("w3", "down", []),
    ]

    answers["127.0.0.1:19111"] = {"state": "taking_over"}  # nobody delivers east now
    east, _ = leaders(topo, health=lambda address: answers[address])
    assert east["leader"] is None and east["owners"] == {} and east["unowned"] == ["p0", "p1", "p2"]
