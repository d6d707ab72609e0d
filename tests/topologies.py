"""Topology text the tests share: the smallest topology (one region, one cluster) the loader tests edit, the web
tier's `[[rules]]`, and a master region of clusters given by address; and the loader tests' two checks: a mistake
is one error naming file and key, and a topology moves to new ports whole."""

from __future__ import annotations

import itertools

import pytest

import router_config
from router_config import CANARY_TABLE, TopologyError

USERS_RULE = '\n[[rules]]\ntable = "app.users"\nkeys = ["user:{id}"]\n\n'
CANARY_RULE = f'[[rules]]\ntable = "{CANARY_TABLE}"\nkeys = ["squeal:canary:{{id}}"]\n'

WEBTIER_CODEC = "loadtest.webtier:verify_codec"
# the web tier's tables (loadtest/webtier.py's schema) and the keys each row's change deletes
WEBTIER_KEYS = (
    ("users", '"user:{id}", "user:email:{email}"'),
    ("posts", '"post:{id}", "feed:{author_id}"'),
    ("follows", '"followers:{followee_id}", "following:{follower_id}"'),
)


def webtier_rules(database: str, *, canary: bool = False) -> str:
    """The `[[rules]]` of the web tier's tables in `database`, with the web tier's codec (which `squealctl verify`
    reads); `canary`: also the prober's canary table's rule."""
    rules = "".join(
        f'[[rules]]\ntable = "{database}.{table}"\nkeys = [{keys}]\ncodec = "{WEBTIER_CODEC}"\n'
        for table, keys in WEBTIER_KEYS
    )
    return rules + CANARY_RULE if canary else rules


def east_region(port: int, clusters: dict[str, tuple[str, ...]]) -> str:
    """`[regions.east]`, the master, its primary database on `port` (server_id 1), with one cluster for each entry
    of `clusters`: name -> (its router's address, then its wildcard pool's servers' addresses)."""
    text = f'[regions.east]\nmaster = true\ndatabase = {{ role = "primary", port = {port}, server_id = 1 }}\n'
    for name, (router, *servers) in clusters.items():
        listed = ", ".join(f'"{server}"' for server in servers)
        text += f'[regions.east.clusters.{name}]\nrouters = ["{router}"]\npools.wildcard = {{ servers = [{listed}] }}\n'
    return text


# One rule, one region, one cluster on fixed ports: what the loader tests edit a line of (nothing listens on them).
ONE_CLUSTER = USERS_RULE + east_region(33306, {"a": ("127.0.0.1:5000", "127.0.0.1:5001")})


def tls_section(pki: dict) -> str:
    """`[tls]` requiring TLS, trusting the CA `pki["ca"]`, squeal's own certificate `pki["squeal"]` (the tests' `pki`
    fixtures: name -> ops.tls.CertPair)."""
    return (
        f'[tls]\nca = "{pki["ca"].cert}"\nrequire = true\n'
        f'[tls.squeal]\ncert = "{pki["squeal"].cert}"\nkey = "{pki["squeal"].key}"\n'
    )


def refused(text: str, source: str) -> TopologyError:
    """The TopologyError that loading `text` (as the file `source`) must raise."""
    with pytest.raises(TopologyError) as info:
        router_config.loads(text, source=source)
    return info.value


def refused_edit(good: str, old: str, new: str, source: str) -> TopologyError:
    """The TopologyError that loading `good` with its first `old` made `new` (as the file `source`) must raise."""
    assert old in good, "the test's edit must apply"
    return refused(good.replace(old, new, 1), source)


def assert_mistake_named(good: str, old: str, new: str, source: str, path: str, words: str) -> None:
    """`good` with its first `old` made `new` fails to load with one TopologyError that names the file `source`
    first, the key `path`, and says `words`."""
    error = refused_edit(good, old, new, source)
    message = str(error)
    assert message.startswith(f"{source}: "), message
    assert error.path == path, message
    assert words in message, message


def on_new_ports(topo: router_config.Topology, first: int = 41000) -> router_config.Topology:
    """`topo` with its ports reassigned to `first`, `first` + 1, ..."""
    ports = itertools.count(first)
    return router_config.reassign_ports(topo, lambda: next(ports))


def assert_listeners_moved(topo: router_config.Topology, moved: router_config.Topology) -> None:
    """`moved` listens in the same roles at the same keys as `topo`, on none of `topo`'s ports."""
    before, after = topo.listeners(), moved.listeners()
    assert [(role, where) for role, where, _ in before] == [(role, where) for role, where, _ in after]
    assert not {a.port for _, _, a in before} & {a.port for _, _, a in after}
