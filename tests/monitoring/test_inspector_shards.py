"""The consistency inspector on the sharded example: one shard's stalled copy shows as that shard's falling
nines only (examples/sharded.toml brought up for real: four shards, two regions, pooled squeal workers).

The west copy of one shard stops applying its primary's changes (STOP SLAVE SQL_THREAD): west's squeal reads
that copy, so nothing of the shard is invalidated in the west while the primary moves on. The inspector reads
the primaries itself, so it sees those changes and finds them stale in the west, for that shard only."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

import router_config
from loadtest.webtier import WebServer
from ops.harness import REPO_ROOT, ROUTER_BIN, wait_until
from tests.binaries import needs_binary
from tests.ops.deployments import squealctl, stable_port

pytestmark = [pytest.mark.slow, needs_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")]

STALLED, HEALTHY = "users-1", "users-2"


def test_a_stalled_shard_copy_shows_as_that_shards_inconsistent_keys_only(tmp_path: Path) -> None:
    topo = router_config.reassign_ports(router_config.load(REPO_ROOT / "examples" / "sharded.toml"), stable_port)
    path = tmp_path / "sharded.toml"
    path.write_text(router_config.dumps(topo))
    state = Path(tempfile.mkdtemp(prefix="squeal-insp-sh-"))
    master = reader = None
    try:
        squealctl(state, "up", str(path))
        master = WebServer(topo, topo.master.name)
        reader = WebServer(topo, "west", "west-a")
        stamp = int(time.time() * 1000)
        users = {
            shard: [master.create_user(f"s{i}", f"{shard}-{stamp}-{i}@test.example", shard=shard) for i in range(4)]
            for shard in (STALLED, HEALTHY)
        }
        for u in users[STALLED] + users[HEALTHY]:  # cached in the west (once replicated there)
            wait_until(lambda u=u: reader.get_user(u) is not None, 30, f"user {u} readable in the west")

        copy = router_config.connect_database(topo.shard(STALLED).copy("west"), "monitoring")
        try:
            with copy.cursor() as cur:
                cur.execute("STOP SLAVE SQL_THREAD")
            for u in users[STALLED] + users[HEALTHY]:
                master.update_user(u, name=f"renamed-{u}")

            def report() -> dict | None:
                url = f"http://{topo.monitoring.host}:{topo.monitoring.port}/api/consistency?since=3600"
                with urllib.request.urlopen(url, timeout=10) as answer:
                    doc = json.loads(answer.read())
                west = doc["regions"].get("west", {}).get("shards", {})
                bad = west.get(STALLED, {}).get("1s", {}).get("inconsistent", 0)
                checked = west.get(HEALTHY, {}).get("1s", {}).get("checked", 0)
                return doc if bad >= len(users[STALLED]) and checked >= len(users[HEALTHY]) else None

            doc = wait_until(report, 60, f"{STALLED}'s renamed users inconsistent in the west", ignore=(OSError,))
        finally:
            with copy.cursor() as cur:
                cur.execute("START SLAVE SQL_THREAD")
            copy.close()
        west, east = doc["regions"]["west"], doc["regions"]["east"]
        assert all(f["inconsistent"] == 0 for f in west["shards"][HEALTHY].values()), west["shards"][HEALTHY]
        others = [s for s in west["shards"] if s != STALLED]
        assert all(west["shards"][s]["1s"]["inconsistent"] == 0 for s in others), west["shards"]
        assert all(f["inconsistent"] == 0 for f in east["windows"].values()), east["windows"]
        assert west["windows"]["1s"]["nines"] is not None, "the west's nines fell"
        stale_keys = {r["key"] for r in doc["recent"] if r["shard"] == STALLED and r["region"] == "west"}
        assert {f"user:{u}" for u in users[STALLED]} <= stale_keys
        assert not any(r["shard"] != STALLED for r in doc["recent"]), doc["recent"][:3]
    finally:
        for web in (master, reader):
            if web is not None:
                web.close()
        squealctl(state, "down", check=False)
        shutil.rmtree(state, ignore_errors=True)
