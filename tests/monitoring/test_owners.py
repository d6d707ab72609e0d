"""monitoring.owners.ownership from the workers' /healthz answers (given here; the pool deployment tests ask
real workers): which worker delivers each shard of a pooled region, which own nothing, and the shards nobody
delivers."""

from __future__ import annotations

from typing import Any

import router_config
from monitoring.owners import ownership

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


def test_owners_of_every_shard_of_two_pools() -> None:
    topo = router_config.loads(TOPOLOGY)
    answers: dict[str, dict[str, Any] | None] = {
        "127.0.0.1:19110": {"state": "worker", "owns": []},  # east's idle worker: owning nothing
        "127.0.0.1:19111": {"state": "worker", "owns": ["p1", "p0", "p2"]},
        "127.0.0.1:19210": {"state": "worker", "owns": ["p2", "p0"]},
        "127.0.0.1:19211": {"state": "worker", "owns": []},
        "127.0.0.1:19212": None,  # down
    }
    east, west = ownership(topo, health=lambda address: answers[address])
    assert east["region"] == "east" and east["idle"] == ["east-1"]
    assert east["owners"] == {"p0": "east-2", "p1": "east-2", "p2": "east-2"} and east["unowned"] == []
    assert (west["region"], west["idle"]) == ("west", ["w2"])
    assert west["owners"] == {"p0": "w1", "p2": "w1"} and west["unowned"] == ["p1"]
    assert [(i["name"], i["state"], i["owns"]) for i in west["instances"]] == [
        ("w1", "worker", ["p0", "p2"]),
        ("w2", "worker", []),
        ("w3", "down", []),
    ]

    answers["127.0.0.1:19111"] = {"state": "starting"}  # nobody delivers east now
    east, _ = ownership(topo, health=lambda address: answers[address])
    assert east["owners"] == {} and east["unowned"] == ["p0", "p1", "p2"] and east["idle"] == ["east-1"]
