"""Topology text the tests share: the smallest topology (one region, one cluster) the loader tests edit, the web
tier's `[[rules]]`, and a master region of clusters given by address."""

from __future__ import annotations

from router_config import CANARY_TABLE

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
