"""A demo web tier: a tiny social network (users, posts, follows) on leases and remote markers.

One `WebServer` is one web server process of one cluster in one region. Reads are look-aside through
`leases.LeaseCache` (one lease per key, no stale sets), or with `client="stock"` through a stock memcached
client (`loadtest.stockcache`: pymemcache, plain get/set; leases only if the router's pool gives them).
Writes go to the master database with the keys they affect embedded as ``/* mcd:… */`` (plus remote
markers when the region is not the master), and delete those keys in the local cluster for read-after-write.
squeal deletes them everywhere else after the write replicates. Cache keys match the invalidation rules
of examples/local.toml:

    users   -> user:{id}, user:email:{email}
    posts   -> post:{id}, feed:{author_id}
    follows -> followers:{followee_id}, following:{follower_id}

Sharded topologies (`[shards]`, docs/squeal.md "Shards") spread the rows with the topology's shard map,
`Topology.shard_of(id)`: a user lives on the shard of its id; a post with its author (its id is allocated
on the author's shard, so it maps back there too); a follow with its follower. Ids are allocated on the
owning shard's primary in that shard's series (`Topology.auto_increment_for`), so they are unique fleet-wide.
Each key family says where its rows are (`KeyFamily.shards`): on the shard of the key's argument
(`user:{id}`, `post:{id}`, `feed:{author_id}`, `following:{follower_id}`) or anywhere, read from every shard
and merged in the family's order (`user:email:{email}`, `followers:{followee_id}`). Keys are the same
whichever shard a row lives on. Without [shards] there is one shard and every read and write is as before.

Locust workloads drive this object directly (no HTTP layer: the cache and database traffic is the point).
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from leases import ClientStats, LeaseCache, WaitPolicy, connect
from leases.serializer import JSON_FLAG
from loadtest.stockcache import StockCache, stock_client
from monitoring.verify import CachedRows, order_terms
from remote_markers import RemoteMarkers, SqlClient
from router_config import Topology, client_context

CLIENTS = ("lease", "stock")  # WebServer(client=…): our lease client, or a stock memcached client

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


def install_schema_on_shards(topology: Topology, database: str = "app") -> None:
    """Create the demo schema on every shard's primary (each shard's copies get it through replication)."""
    for shard in topology.shards:
        admin = SqlClient.for_database(topology.shard_copy(shard.name, topology.master.name), None, role="admin")
        try:
            install_schema(admin, database)
        finally:
            admin.close()


def shard_master(topology: Topology, shard: str, database: str = "app") -> SqlClient:
    """A client on `shard`'s primary for writers: with [shards], every session allocates AUTO_INCREMENT ids in
    the shard's own series (`Topology.auto_increment_for`), so a new row's id maps back to it (`shard_of`)."""
    init = None
    if topology.sharded:
        increment, offset = topology.auto_increment_for(shard)
        init = f"SET SESSION auto_increment_increment = {increment}, auto_increment_offset = {offset}"
    db = topology.shard_copy(shard, topology.master.name)
    role = f"shard {shard} master" if topology.sharded else "master"
    return SqlClient.for_database(db, database, role=role, init_command=init)


def _nulls_first(column: str | None, item: Any) -> tuple[bool, Any]:
    """A sort key as MariaDB orders NULLs (first): the item itself (`column` None), or its column."""
    value = item if column is None else item[column]
    return value is not None, value


@dataclass(frozen=True)
class KeyFamily:
    """One kind of cache key the web tier fills: `<prefix>:<arg>` holds what `query` returns for `arg`.

    The read methods below load through this; `verify_codec` (the rules' codec in the topology) tells the
    consistency checker (`squealctl verify`) which rows a cached value holds, from the same queries.
    shape: "row" (one dict or None), "rows" (list of dicts), "column" (list of the first column's values).
    shards: where the key's rows live in a sharded topology: "arg" on the shard that owns the key's argument
    (`Topology.shard_of(arg)`), "all" on any shard (read every shard, `merge` the answers).
    """

    prefix: str
    query: str  # one %s: the key's argument
    shape: str
    shards: str = "arg"

    def key(self, arg: Any) -> str:
        return f"{self.prefix}:{arg}"

    def merge(self, parts: Sequence[Any]) -> Any:
        """One answer from the answers of several shards, as one database holding all their rows would give:
        a row: the first found; lists: all of them in the query's ORDER BY, cut to its LIMIT."""
        if len(parts) == 1:
            return parts[0]
        if self.shape == "row":
            return next((p for p in parts if p is not None), None)
        merged = [item for part in parts for item in part]
        query = _QUERY.match(self.query)
        assert query, self.query
        for column, descending in reversed(order_terms(query["order"])):  # stable sorts, last key first
            whole = column == "1" or self.shape == "column"  # a list of values, else of rows
            merged.sort(key=functools.partial(_nulls_first, None if whole else column), reverse=descending)
        return merged[: int(query["limit"])] if query["limit"] else merged

    def load(self, db: SqlClient, key: str) -> Any:
        arg = key[len(self.prefix) + 1 :]
        if self.shape == "row":
            return db.query_one(self.query, (arg,))
        rows = db.query(self.query, (arg,))
        if self.shape == "column":
            return [next(iter(r.values())) for r in rows]
        return rows


KEY_FAMILIES: dict[str, KeyFamily] = {
    f.prefix: f
    for f in (
        KeyFamily("user", "SELECT id, name, email FROM users WHERE id = %s", "row"),
        KeyFamily("user:email", "SELECT id, name, email FROM users WHERE email = %s", "row", "all"),
        KeyFamily("post", "SELECT id, author_id, body FROM posts WHERE id = %s", "row"),
        KeyFamily(
            "feed",
            f"SELECT id, author_id, body FROM posts WHERE author_id = %s ORDER BY id DESC LIMIT {FEED_LENGTH}",
            "rows",
        ),
        KeyFamily(
            "followers",
            "SELECT follower_id FROM follows WHERE followee_id = %s ORDER BY 1",
            "column",
            "all",  # follows live with the follower: a followee's followers are on every shard
        ),
        KeyFamily(
            "following",
            "SELECT followee_id FROM follows WHERE follower_id = %s ORDER BY 1",
            "column",
        ),
    )
}

# a KeyFamily query's parts the codec needs: the selected columns, the order and the window
_QUERY = re.compile(
    r"SELECT (?P<columns>.+?) FROM \w+ WHERE .+?(?: ORDER BY (?P<order>.+?))?(?: LIMIT (?P<limit>\d+))?$"
)


def _family(template: str) -> KeyFamily:
    """The KEY_FAMILIES entry of a rule's key template, e.g. "feed:{author_id}" (KeyError: not one we fill)."""
    return KEY_FAMILIES[template.split("{", 1)[0].rstrip(":")]


class VerifyCodec:
    """How `squealctl verify` reads what this web tier caches: registered as the `codec` of the rules in
    examples/local.toml (monitoring/verify/__init__.py has the contract), as `loadtest.webtier:verify_codec`."""

    def __call__(self, family: str, value: bytes, flags: int) -> Any:
        """`family` is a rule's key template, e.g. "feed:{author_id}"; the answer is the rows the value holds,
        in KEY_FAMILIES' terms."""
        return _decode(family, value, flags)

    def shard_column(self, family: str) -> str | None:
        """The template's column whose value places every row of a key on `Topology.shard_of(value)` (a
        family read from one shard), or None: its rows may be on any shard (verify reads them all)."""
        try:
            fam = _family(family)
        except KeyError:
            return None
        columns = re.findall(r"\{([^{}]*)\}", family)
        return columns[0] if fam.shards == "arg" and len(columns) == 1 else None


def _decode(family: str, value: bytes, flags: int) -> Any:
    fam = _family(family)  # KeyError (a LookupError): not a key we fill
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


verify_codec = VerifyCodec()


@dataclass(frozen=True)
class ShardClients:
    """One shard as a web server of one region sees it: its master (writes, ids in the shard's series), the
    region's copy (reads) and the remote-marker protocol between them."""

    name: str
    master: SqlClient
    local: SqlClient
    rm: RemoteMarkers


class WebServer:
    """The demo web server of `cluster` in `region`, with topology from `router_config`.

    The cache client talks to the cluster's routers (`Cluster.routers`); remote markers (``rmk:``) reach
    the regional pool through the router's prefix route. `regional_direct=True` writes and reads markers
    on the regional pool's servers instead: for a memcached standing in for the router (tests, no
    router built), which has no prefix routing.
    leases / markers: turn either mechanism off for comparisons.
    client: "lease" (`leases.LeaseCache`, meta commands) or "stock" (`StockCache`: pymemcache's plain get/set,
    no lease code; `leases` does not apply, the cluster's pools decide: a pool's `leases` in the topology
    turns the router's transparent leases on). Remote markers use the same client.

    Databases: one `ShardClients` per shard of the topology (`shards`); `master`, `local` and `rm` are the
    first shard's — the only one without [shards]. Writes and reads of one row go to `shard_for(id)`.
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
        client: str = "lease",
    ) -> None:
        if client not in CLIENTS:
            raise ValueError(f"client {client!r}: one of {', '.join(CLIENTS)}")
        reg = topology.region(region)
        cl = topology.cluster(cluster) if cluster else reg.clusters[0]
        if cl.region != reg.name:
            raise ValueError(f"cluster {cl.name} is in region {cl.region}, not {reg.name}")
        self.region, self.cluster, self.ttl = reg, cl, ttl
        marker_cache: LeaseCache | StockCache | None = None
        # [tls]: the routers (and a regional pool dialled directly) over TLS, as the web tier
        tls = functools.partial(client_context, topology.tls, "webtier") if topology.tls is not None else None
        self.cache: LeaseCache | StockCache
        if client == "stock":
            context = tls() if tls is not None else None
            self.cache = StockCache(stock_client(cl.routers, timeout=recv_timeout, tls_context=context), name=cl.name)
            if regional_direct and reg.regional_pool is not None:
                marker_cache = StockCache(
                    stock_client(reg.regional_pool.servers, timeout=recv_timeout, tls_context=context),
                    name=f"{reg.name}-regional",
                )
        else:
            if regional_direct and reg.regional_pool is not None:
                marker_cache = LeaseCache(
                    connect(reg.regional_pool.servers, recv_timeout=recv_timeout, tls=tls),
                    name=f"{reg.name}-regional",
                )
            self.cache = LeaseCache(
                connect(cl.routers, recv_timeout=recv_timeout, tls=tls),
                name=cl.name,
                leases=leases,
                lease_ttl=lease_ttl,
                wait=wait,
            )
        self.topology = topology
        self.shards: dict[str, ShardClients] = {}
        for shard in topology.shards:
            master = shard_master(topology, shard.name, database)
            local = master
            if not reg.master:
                copy = topology.shard_copy(shard.name, reg.name)
                role = f"shard {shard.name} {reg.name} replica" if topology.sharded else f"{reg.name} replica"
                local = SqlClient.for_database(copy, database, role=role)
            rm = RemoteMarkers(
                # StockCache has every method RemoteMarkers calls (get_or_fill, set, exists, delete, stats)
                cast(LeaseCache, self.cache),
                master=master,
                local=local,
                is_master_region=reg.master,
                markers=cast(LeaseCache | None, marker_cache),
                enabled=markers,
                marker_ttl=marker_ttl,
            )
            self.shards[shard.name] = ShardClients(shard.name, master, local, rm)
        first = next(iter(self.shards.values()))
        self.master, self.local, self.rm = first.master, first.local, first.rm

    @property
    def stats(self) -> ClientStats:
        return self.cache.stats

    # -- the shard map ----------------------------------------------------------------------------------

    def shard_for(self, row_id: int) -> ShardClients:
        """The shard that owns the row with this id (and, by the layout above, everything keyed by it)."""
        return self.shards[self.topology.shard_of(row_id).name]

    def rm_for(self, row_id: int) -> RemoteMarkers:
        """The write protocol for a change to the row with this id (on its shard's master)."""
        return self.shard_for(row_id).rm

    def shard_for_email(self, email: str) -> ShardClients:
        """Where a new user with this email goes: a hash of the email, so one address always lands on one
        shard and the shard's unique key refuses a duplicate (an email changed later is not checked across
        shards)."""
        names = list(self.shards)
        return self.shards[names[zlib.crc32(email.lower().encode()) % len(names)]]

    def _owners(self, fam: KeyFamily, arg: Any) -> list[ShardClients]:
        """The shards a key of `fam` with this argument is read from."""
        if len(self.shards) > 1 and fam.shards == "arg":
            return [self.shard_for(arg)]
        return list(self.shards.values())

    def _check_owner(self, shard: ShardClients, row_id: int, what: str) -> None:
        owner = self.topology.shard_of(row_id).name
        if owner != shard.name:
            raise RuntimeError(
                f"new {what} id {row_id} was allocated on shard {shard.name} but the shard map puts it on {owner}: "
                "the session's auto_increment_increment/offset are not Topology.auto_increment_for's"
            )

    def query_all(self, sql: str, args: Any = None) -> list[dict[str, Any]]:
        """A query run on every shard's master, the rows concatenated (in shard order)."""
        return [row for shard in self.shards.values() for row in shard.master.query(sql, args)]

    def _read(self, family: str, arg: Any, *, stale_ok: bool = False) -> Any:
        """Look-aside read of one key family (leases, remote markers) loading through KEY_FAMILIES: from the
        shard that owns `arg`, or from every shard (one remote-marker decision: all masters or all copies)."""
        fam = KEY_FAMILIES[family]
        key = fam.key(arg)
        owners = self._owners(fam, arg)
        if len(owners) == 1:
            return owners[0].rm.read_through(key, lambda db: fam.load(db, key), self.ttl, stale_ok=stale_ok)

        def fill() -> Any:
            at_master = owners[0].rm.reads_master(key)
            return fam.merge([fam.load(s.master if at_master else s.local, key) for s in owners])

        return self.cache.get_or_fill(key, fill, self.ttl, stale_ok=stale_ok)

    # -- users ----------------------------------------------------------------------------------------

    def get_user(self, user_id: int, *, stale_ok: bool = False) -> dict[str, Any] | None:
        return self._read("user", user_id, stale_ok=stale_ok)

    def get_user_by_email(self, email: str) -> dict[str, Any] | None:
        return self._read("user:email", email)

    def create_user(self, name: str, email: str, *, shard: str | None = None) -> int:
        """A new user on `shard` (default: `shard_for_email`); its id maps back to that shard."""
        owner = self.shards[shard] if shard is not None else self.shard_for_email(email)
        _, user_id = owner.rm.write_with_marker(
            [f"user:email:{email}"], "INSERT INTO users (name, email) VALUES (%s, %s)", (name, email)
        )
        owner.rm.mark_and_delete([f"user:{user_id}"])
        self._check_owner(owner, user_id, "user")
        return user_id

    def update_user(self, user_id: int, *, name: str | None = None, email: str | None = None) -> bool:
        """Change name and/or email; False if there is no such user."""
        owner = self.shard_for(user_id)
        old = owner.master.query_one("SELECT email FROM users WHERE id = %s", (user_id,))
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
        owner.rm.write_with_marker(keys, f"UPDATE users SET {', '.join(sets)} WHERE id = %s", (*args, user_id))
        return True

    # -- posts ----------------------------------------------------------------------------------------

    def create_post(self, author_id: int, body: str) -> int:
        """A new post, on its author's shard (its id is allocated there, so it maps back to it)."""
        owner = self.shard_for(author_id)
        _, post_id = owner.rm.write_with_marker(
            [f"feed:{author_id}"], "INSERT INTO posts (author_id, body) VALUES (%s, %s)", (author_id, body)
        )
        owner.rm.mark_and_delete([f"post:{post_id}"])
        self._check_owner(owner, post_id, "post")
        return post_id

    def get_post(self, post_id: int) -> dict[str, Any] | None:
        return self._read("post", post_id)

    def get_feed(self, author_id: int, *, stale_ok: bool = True) -> list[dict[str, Any]]:
        """An author's latest posts, newest first. Feeds tolerate a stale copy while one reader refreshes."""
        return self._read("feed", author_id, stale_ok=stale_ok)

    # -- follows --------------------------------------------------------------------------------------

    def follow(self, follower_id: int, followee_id: int) -> None:
        """On the follower's shard: `following:{follower}` reads one shard, `followers:{followee}` every shard."""
        self.rm_for(follower_id).write_with_marker(
            [f"followers:{followee_id}", f"following:{follower_id}"],
            "INSERT IGNORE INTO follows (follower_id, followee_id) VALUES (%s, %s)",
            (follower_id, followee_id),
        )

    def unfollow(self, follower_id: int, followee_id: int) -> None:
        self.rm_for(follower_id).write_with_marker(
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
        for shard in self.shards.values():
            shard.master.close()
            shard.local.close()
