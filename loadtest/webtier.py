"""A demo web tier: a tiny social network (users, posts, follows) on leases and remote markers.

One `WebServer` is one web server process of one cluster in one region. Reads are look-aside through
`leases.LeaseCache` (one lease per key, no stale sets); writes go to the master database with the keys
they affect embedded as ``/* mcd:… */`` (plus remote markers when the region is not the master), and
delete those keys in the local cluster for read-after-write. squeal deletes them everywhere else after
the write replicates. Cache keys match the invalidation rules of examples/local.toml:

    users   -> user:{id}, user:email:{email}
    posts   -> post:{id}, feed:{author_id}
    follows -> followers:{followee_id}, following:{follower_id}

Locust workloads drive this object directly (no HTTP layer: the cache and database traffic is the point).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leases import ClientStats, LeaseCache, WaitPolicy, connect
from leases.serializer import JSON_FLAG
from monitoring.verify import CachedRows
from remote_markers import RemoteMarkers, SqlClient
from router_config import Topology

SCHEMA_SQL = Path(__file__).with_name("schema.sql")
FEED_LENGTH = 20  # posts kept in a cached feed
DEFAULT_TTL = 300


def schema_statements(database: str = "app") -> list[str]:
    """The statements of schema.sql, creating and using `database` instead of `app`."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", database):
        raise ValueError(f"not a plain database name: {database!r}")
    text = "\n".join(line for line in SCHEMA_SQL.read_text().splitlines() if not line.lstrip().startswith("--"))
    out = []
    for stmt in (s.strip() for s in text.split(";")):
        if stmt:
            out.append(re.sub(r"^(CREATE DATABASE IF NOT EXISTS|USE)\s+app\b", rf"\1 {database}", stmt))
    return out


def install_schema(db: SqlClient, database: str = "app") -> None:
    """Create the demo schema on `db` (the master; replicas get it through replication)."""
    for stmt in schema_statements(database):
        db.execute(stmt)


@dataclass(frozen=True)
class KeyFamily:
    """One kind of cache key the web tier fills: `<prefix>:<arg>` holds what `query` returns for `arg`.

    The read methods below load through this; `verify_codec` (the rules' codec in the topology) tells the
    consistency checker (`squealctl verify`) which rows a cached value holds, from the same queries.
    shape: "row" (one dict or None), "rows" (list of dicts), "column" (list of the first column's values).
    """

    prefix: str
    query: str  # one %s: the key's argument
    shape: str
    all_args: str  # every argument currently in the database (for sampling)

    def key(self, arg: Any) -> str:
        return f"{self.prefix}:{arg}"

    def load(self, db: SqlClient, key: str) -> Any:
        arg = key[len(self.prefix) + 1 :]
        if self.shape == "row":
            return db.query_one(self.query, (arg,))
        rows = db.query(self.query, (arg,))
        if self.shape == "column":
            return [next(iter(r.values())) for r in rows]
        return rows

    def all_keys(self, db: SqlClient) -> list[str]:
        return [self.key(next(iter(r.values()))) for r in db.query(self.all_args, ())]


KEY_FAMILIES: dict[str, KeyFamily] = {
    f.prefix: f
    for f in (
        KeyFamily("user", "SELECT id, name, email FROM users WHERE id = %s", "row", "SELECT id FROM users"),
        KeyFamily("user:email", "SELECT id, name, email FROM users WHERE email = %s", "row", "SELECT email FROM users"),
        KeyFamily("post", "SELECT id, author_id, body FROM posts WHERE id = %s", "row", "SELECT id FROM posts"),
        KeyFamily(
            "feed",
            f"SELECT id, author_id, body FROM posts WHERE author_id = %s ORDER BY id DESC LIMIT {FEED_LENGTH}",
            "rows",
            "SELECT DISTINCT author_id FROM posts",
        ),
        KeyFamily(
            "followers",
            "SELECT follower_id FROM follows WHERE followee_id = %s ORDER BY 1",
            "column",
            "SELECT DISTINCT followee_id FROM follows",
        ),
        KeyFamily(
            "following",
            "SELECT followee_id FROM follows WHERE follower_id = %s ORDER BY 1",
            "column",
            "SELECT DISTINCT follower_id FROM follows",
        ),
    )
}

# a KeyFamily query's parts the codec needs: the selected columns, the order and the window
_QUERY = re.compile(
    r"SELECT (?P<columns>.+?) FROM \w+ WHERE .+?(?: ORDER BY (?P<order>.+?))?(?: LIMIT (?P<limit>\d+))?$"
)


def verify_codec(family: str, value: bytes, flags: int) -> Any:
    """How `squealctl verify` reads what this web tier caches: registered as the `codec` of the rules in
    examples/local.toml (monitoring/verify.py has the contract). `family` is a rule's key template, e.g.
    "feed:{author_id}"; the answer is the rows the value holds, in KEY_FAMILIES' terms."""
    fam = KEY_FAMILIES[family.split("{", 1)[0].rstrip(":")]  # KeyError (a LookupError): not a key we fill
    if flags != JSON_FLAG:
        raise ValueError(f"client flag {flags}: not written by the web tier's JsonSerializer")
    doc = json.loads(value)
    if fam.shape == "row":
        return doc  # one row, or None: the web tier cached "no such row"
    query = _QUERY.match(fam.query)
    assert query, fam.query
    if fam.shape == "column":  # a list of one column's values (ORDER BY 1: compared as a set)
        return [{query["columns"]: v} for v in doc]
    limit = int(query["limit"]) if query["limit"] else None
    return CachedRows(tuple(doc), order_by=query["order"], limit=limit)  # e.g. a feed: latest 20 by id


class WebServer:
    """The demo web server of `cluster` in `region`, with topology from `router_config`.

    The cache client talks to the cluster's routers (`Cluster.routers`); remote markers (``rmk:``) reach
    the regional pool through the router's prefix route. `regional_direct=True` writes and reads markers
    on the regional pool's servers instead: for a memcached standing in for the router (tests, no
    router built), which has no prefix routing.
    leases / markers: turn either mechanism off for comparisons.
    """

    def __init__(
        self,
        topology: Topology,
        region: str,
        cluster: str | None = None,
        *,
        database: str = "app",
        regional_direct: bool = False,
        leases: bool = True,
        markers: bool = True,
        ttl: int = DEFAULT_TTL,
        lease_ttl: int = 10,
        wait: WaitPolicy | None = None,
        marker_ttl: int = 300,
        recv_timeout: float = 1.0,
    ) -> None:
        reg = topology.region(region)
        cl = topology.cluster(cluster) if cluster else reg.clusters[0]
        if cl.region != reg.name:
            raise ValueError(f"cluster {cl.name} is in region {cl.region}, not {reg.name}")
        self.region, self.cluster, self.ttl = reg, cl, ttl
        marker_cache: LeaseCache | None = None
        client = connect(cl.routers, recv_timeout=recv_timeout)
        if regional_direct and reg.regional_pool is not None:
            marker_cache = LeaseCache(
                connect(reg.regional_pool.servers, recv_timeout=recv_timeout), name=f"{reg.name}-regional"
            )
        self.cache = LeaseCache(client, name=cl.name, leases=leases, lease_ttl=lease_ttl, wait=wait)
        self.master = SqlClient.for_database(topology.master.database, database, role="master")
        self.local = (
            self.master if reg.master else SqlClient.for_database(reg.database, database, role=f"{reg.name} replica")
        )
        self.rm = RemoteMarkers(
            self.cache,
            master=self.master,
            local=self.local,
            is_master_region=reg.master,
            markers=marker_cache,
            enabled=markers,
            marker_ttl=marker_ttl,
        )

    @property
    def stats(self) -> ClientStats:
        return self.cache.stats

    def _read(self, family: str, arg: Any, *, stale_ok: bool = False) -> Any:
        """Look-aside read of one key family (leases, remote markers) loading through KEY_FAMILIES."""
        fam = KEY_FAMILIES[family]
        key = fam.key(arg)
        return self.rm.read_through(key, lambda db: fam.load(db, key), self.ttl, stale_ok=stale_ok)

    # -- users ----------------------------------------------------------------------------------------

    def get_user(self, user_id: int, *, stale_ok: bool = False) -> dict[str, Any] | None:
        return self._read("user", user_id, stale_ok=stale_ok)

    def get_user_by_email(self, email: str) -> dict[str, Any] | None:
        return self._read("user:email", email)

    def create_user(self, name: str, email: str) -> int:
        _, user_id = self.rm.write_with_marker(
            [f"user:email:{email}"], "INSERT INTO users (name, email) VALUES (%s, %s)", (name, email)
        )
        self.rm.mark_and_delete([f"user:{user_id}"])
        return user_id

    def update_user(self, user_id: int, *, name: str | None = None, email: str | None = None) -> bool:
        """Change name and/or email; False if there is no such user."""
        old = self.master.query_one("SELECT email FROM users WHERE id = %s", (user_id,))
        if old is None:
            return False
        sets, args = [], []
        keys = [f"user:{user_id}", f"user:email:{old['email']}"]
        if name is not None:
            sets.append("name = %s")
            args.append(name)
        if email is not None:
            sets.append("email = %s")
            args.append(email)
            keys.append(f"user:email:{email}")
        if not sets:
            return True
        self.rm.write_with_marker(keys, f"UPDATE users SET {', '.join(sets)} WHERE id = %s", (*args, user_id))
        return True

    # -- posts ----------------------------------------------------------------------------------------

    def create_post(self, author_id: int, body: str) -> int:
        _, post_id = self.rm.write_with_marker(
            [f"feed:{author_id}"], "INSERT INTO posts (author_id, body) VALUES (%s, %s)", (author_id, body)
        )
        self.rm.mark_and_delete([f"post:{post_id}"])
        return post_id

    def get_post(self, post_id: int) -> dict[str, Any] | None:
        return self._read("post", post_id)

    def get_feed(self, author_id: int, *, stale_ok: bool = True) -> list[dict[str, Any]]:
        """An author's latest posts, newest first. Feeds tolerate a stale copy while one reader refreshes."""
        return self._read("feed", author_id, stale_ok=stale_ok)

    # -- follows --------------------------------------------------------------------------------------

    def follow(self, follower_id: int, followee_id: int) -> None:
        self.rm.write_with_marker(
            [f"followers:{followee_id}", f"following:{follower_id}"],
            "INSERT IGNORE INTO follows (follower_id, followee_id) VALUES (%s, %s)",
            (follower_id, followee_id),
        )

    def unfollow(self, follower_id: int, followee_id: int) -> None:
        self.rm.write_with_marker(
            [f"followers:{followee_id}", f"following:{follower_id}"],
            "DELETE FROM follows WHERE follower_id = %s AND followee_id = %s",
            (follower_id, followee_id),
        )

    def get_followers(self, user_id: int) -> list[int]:
        return self._read("followers", user_id)

    def get_following(self, user_id: int) -> list[int]:
        return self._read("following", user_id)

    def get_timeline(self, user_id: int) -> list[dict[str, Any]]:
        """Home page: the latest posts of everyone `user_id` follows (one cached feed per followee)."""
        posts = [p for followee in self.get_following(user_id) for p in self.get_feed(followee)]
        return sorted(posts, key=lambda p: p["id"], reverse=True)[:FEED_LENGTH]

    def close(self) -> None:
        self.master.close()
        self.local.close()
