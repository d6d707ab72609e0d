"""Sampled deletes: the real squeal daemon exposes 1-in-N acknowledged deletes, the checker re-reads them."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from pymemcache.client.base import Client

import router_config
from loadtest.webtier import schema_statements
from monitoring.sampled import SampledDeleteChecker
from ops.harness import SquealDaemon, free_port, wait_until
from tests.topologies import east_region

TOPOLOGY = """
[squeal]
metrics_port_base = {metrics}
datamarker_dir = "{state}"

[[rules]]
table = "sampled_app.users"
keys = ["user:{{id}}"]

"""


def test_checker_flags_a_key_that_holds_a_wrong_value_after_its_delete(
    tmp_path, mariadb_pair, memcached_factory, processes
):
    primary, _ = mariadb_pair
    primary.execute("DROP DATABASE IF EXISTS sampled_app", *schema_statements("sampled_app"))
    cache = memcached_factory()
    text = TOPOLOGY.format(metrics=free_port(), state=tmp_path / "state") + east_region(
        primary.port, {"a": (cache.address, "127.0.0.1:1")}
    )
    topo_file = tmp_path / "topo.toml"
    topo_file.write_text(text)
    topo = router_config.load(topo_file)
    daemon = processes.add(
        SquealDaemon(
            topo_file,
            "east",
            port=topo.squeal.metrics_port_base,
            workdir=tmp_path / "squeal",
            extra_args=("--sample-every", "1"),
        )
    )
    checker = SampledDeleteChecker(topo, database="sampled_app", recheck_after=0.0)
    checker.since["east"] = 0.0
    primary.execute(
        *[f"INSERT INTO sampled_app.users (id, name, email) VALUES ({i}, 'n{i}', 'e{i}@x')" for i in (1, 2, 3)]
    )

    def fetched() -> bool:
        checker.fetch()
        return len(checker.pending) >= 3

    wait_until(fetched, 30, "three sampled deletes", error=None)
    assert sorted(s["key"] for _, s in checker.pending) == ["user:1", "user:2", "user:3"]
    with urllib.request.urlopen(f"http://{daemon.address}/sampled-deletes?since=0", timeout=5) as resp:
        assert {s["flow"] for s in json.loads(resp.read())} == {"a"}

    client = Client((cache.host, cache.port), default_noreply=False)
    client.set("user:1", json.dumps({"id": 1, "name": "stale", "email": "e1@x"}).encode(), flags=64)
    client.set("user:2", json.dumps({"id": 2, "name": "n2", "email": "e2@x"}).encode(), flags=64)  # a correct refill
    problems = checker.check_due()
    assert len(problems) == 1 and "user:1 still holds" in problems[0], problems
    assert checker.checked.labels("east", "a")._value.get() == 3
    assert checker.stale.labels("east", "a")._value.get() == 1


def test_checker_asks_every_worker_of_a_pooled_region():
    # Only the workers owning shards have samples, and any worker may own one: each is asked, by its own address.
    example = router_config.load(Path(__file__).resolve().parents[2] / "examples" / "local.toml")
    checker = SampledDeleteChecker(example)
    assert checker.daemons == {s.name: (s.region, str(s.address)) for r in example.regions for s in r.squeal_instances}
    assert sorted(checker.daemons) == ["east-1", "east-2", "west-1", "west-2"]
