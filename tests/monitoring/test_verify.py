"""`squealctl verify` against real MariaDB, memcached and squeal-router: clean caches pass, planted stale values
are found, lease placeholders and in-flight invalidations are not stale, a router that is down is reported while
the other cluster is still checked, and nothing up is one line with exit status 2."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest
from pymemcache.client.base import Client

import router_config
from loadtest.webtier import WebServer, schema_statements
from monitoring.panels import quantile
from monitoring.verify import (
    DEFAULT_GRACE,
    EXIT_CANNOT_CHECK,
    EXIT_CLEAN,
    EXIT_PARTIAL,
    EXIT_STALE,
    measured_grace,
    verify,
)
from ops.harness import ROUTER_BIN, free_port
from tests.binaries import needs_binary
from tests.ops.deployments import squealctl_in_process
from tests.topologies import east_region, webtier_rules

pytestmark = needs_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")
GRACE = 0.3  # tests pass --grace: nothing measures squeal latency here


def topology(*, db: str, port: int, ra: int, rb: int, ma: str, mb: str, metrics: int) -> str:
    """The web tier's rules for `db`; region east's primary on `port`, its clusters a and b squeal-routers on ports
    `ra` and `rb`, each in front of one memcached (`ma`, `mb`)."""
    return (
        f"[squeal]\nmetrics_port_base = {metrics}\n"
        + webtier_rules(db)
        + east_region(port, {"a": (f"127.0.0.1:{ra}", ma), "b": (f"127.0.0.1:{rb}", mb)})
    )


@pytest.fixture
def world(mariadb_pair, memcached_factory, router_factory, tmp_path):
    """Two clusters, each a squeal-router in front of one memcached; five users cached in cluster a."""
    primary, _ = mariadb_pair
    ma, mb = memcached_factory(), memcached_factory()
    ra, rb = free_port(), free_port()
    text = topology(
        db="verify_app",
        port=primary.port,
        ra=ra,
        rb=rb,
        ma=ma.address,
        mb=mb.address,
        metrics=free_port(),
    )
    path = tmp_path / "topology.toml"
    path.write_text(text)
    topo = router_config.load(path)
    routers = {c: router_factory(router_config.cluster_config(topo, c), port=p) for c, p in (("a", ra), ("b", rb))}
    primary.execute("DROP DATABASE IF EXISTS verify_app", *schema_statements("verify_app"))
    web = WebServer(topo, "east", "a", database="verify_app")
    ids = [web.create_user(f"u{i}", f"u{i}@verify.example") for i in range(5)]
    for user_id in ids:
        web.get_user(user_id)  # fill cluster a through the real read path (leases, router)
    clients = {c: Client(("127.0.0.1", p)) for c, p in (("a", ra), ("b", rb))}
    yield topo, web, ids, clients, routers
    web.close()


def test_clean_caches_pass(world):
    topo, _, ids, _, _ = world
    report = verify(topo, sample=None, grace=GRACE)
    assert report.ok and report.exit_code == EXIT_CLEAN, report
    assert report.checked == len(ids)  # user:N in cluster a; cluster b holds nothing yet
    assert report.clusters == ("a", "b") and report.unchecked == ()


def test_planted_stale_values_are_reported_with_exit_1(world, capsys):
    topo, web, ids, clients, _ = world
    row = web.master.query_one("SELECT id, name, email FROM users WHERE id = %s", (ids[0],))
    clients["b"].set(f"user:{ids[0]}", json.dumps({**row, "name": "old name"}).encode(), expire=300, flags=64)
    web.master.execute("UPDATE users SET name = 'renamed' WHERE id = %s", (ids[1],))  # no squeal: a stays stale
    report = verify(topo, sample=None, grace=GRACE)
    found = {(s.cluster, s.key) for s in report.stale}
    assert found == {("b", f"user:{ids[0]}"), ("a", f"user:{ids[1]}")}
    stale_b = next(s for s in report.stale if s.cluster == "b")
    assert stale_b.cached["name"] == "old name" and stale_b.expected["name"] == "u0"
    assert 0 < stale_b.ttl_left <= 300
    assert "is stale (expires in" in str(stale_b)
    assert report.exit_code == EXIT_STALE

    code, out, _ = squealctl_in_process(capsys, "verify", topo.source, "--all", "--grace", str(GRACE))
    assert code == 1 and f"b: user:{ids[0]} is stale" in out and "2 stale" in out, out


def test_every_demo_key_family_is_read_through_the_rules_and_the_web_tiers_codec(world):
    """Rows (user, post), windows (a feed: the latest 20 posts by id) and column lists (followers) map to rows."""
    topo, web, ids, clients, _ = world
    author, fan = ids[0], ids[1]
    posts = [web.create_post(author, f"post {i}") for i in range(25)]  # more than a feed holds
    web.follow(fan, author)
    web.get_feed(author), web.get_post(posts[0]), web.get_followers(author), web.get_following(fan)
    web.get_user_by_email("u2@verify.example")
    report = verify(topo, sample=None, grace=GRACE)
    assert report.ok and report.checked >= 5 + 5, report  # users, a feed, a post, follower lists, an email key

    # writes that never invalidated the cache: a new post (the feed misses it), a new follower
    web.master.execute("INSERT INTO posts (author_id, body) VALUES (%s, 'unseen')", (author,))
    web.master.execute("INSERT INTO follows (follower_id, followee_id) VALUES (%s, %s)", (ids[2], author))
    stale = {s.key: s for s in verify(topo, sample=None, grace=GRACE).stale}
    assert set(stale) == {f"feed:{author}", f"followers:{author}"}, stale
    assert stale[f"feed:{author}"].expected[0]["body"] == "unseen" and len(stale[f"feed:{author}"].cached) == 20
    assert {r["follower_id"] for r in stale[f"followers:{author}"].expected} == {fan, ids[2]}


def test_a_lease_placeholder_is_not_stale(world):
    """A lease winner's empty item (`mg … N`: 0 bytes, flag 0) while it reads the database is not a value."""
    topo, _, ids, clients, _ = world
    reply = clients["b"].raw_command(f"mg user:{ids[3]} N30 v c".encode(), b"\r\n\r\n")
    assert reply.startswith(b"VA 0") and b"W" in reply.split(b"\r\n")[0], reply  # we hold the lease: 0 bytes cached
    report = verify(topo, sample=None, grace=GRACE)
    assert report.ok and report.placeholders == 1 and report.stale == (), report


def test_an_invalidation_arriving_within_the_grace_period_is_not_reported(world):
    """The database changed and the delete is on its way: re-read after the grace, the copy is gone."""
    topo, web, ids, clients, _ = world
    web.master.execute("UPDATE users SET name = 'moved on' WHERE id = %s", (ids[2],))
    deleter = threading.Timer(0.5, lambda: Client(clients["a"].server).delete(f"user:{ids[2]}", noreply=False))
    started = time.monotonic()
    deleter.start()
    try:
        report = verify(topo, sample=None, grace=2.0)
    finally:
        deleter.join()
    assert report.stale == () and report.in_flight == 1 and report.grace == 2.0, report
    assert time.monotonic() - started >= 2.0  # it did wait before judging
    assert report.exit_code == EXIT_CLEAN


def test_one_router_down_is_reported_and_the_other_cluster_still_checked(world, capsys):
    topo, web, ids, clients, routers = world
    routers["b"].stop()
    report = verify(topo, sample=None, grace=GRACE)
    assert report.clusters == ("a",) and report.checked == len(ids)
    assert [u.cluster for u in report.unchecked] == ["b"] and str(topo.cluster("b").routers[0]) in str(
        report.unchecked[0]
    )
    assert report.exit_code == EXIT_PARTIAL and not report.ok

    code, out, err = squealctl_in_process(capsys, "verify", topo.source, "--all", "--grace", str(GRACE))
    assert code == 3, (out, err)
    assert f"b: NOT CHECKED: router {topo.cluster('b').routers[0]} does not answer" in err
    assert "NOT CHECKED: b" in out.splitlines()[-1]

    web.master.execute("UPDATE users SET name = 'x' WHERE id = %s", (ids[0],))  # cluster a now holds a stale copy
    code, out, err = squealctl_in_process(capsys, "verify", topo.source, "--all", "--grace", str(GRACE))
    assert code == 1 and f"a: user:{ids[0]} is stale" in out, (out, err)


def test_nothing_up_is_one_line_and_exit_2(tmp_path, capsys):
    closed = [free_port() for _ in range(5)]
    path = tmp_path / "down.toml"
    path.write_text(
        topology(
            db="app",
            port=closed[0],
            ra=closed[1],
            rb=closed[2],
            ma=f"127.0.0.1:{closed[3]}",
            mb=f"127.0.0.1:{closed[4]}",
            metrics=free_port(),
        )
    )
    code, out, err = squealctl_in_process(capsys, "--state-dir", str(tmp_path / "state"), "verify", str(path))
    assert code == EXIT_CANNOT_CHECK
    assert out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("squealctl verify: cannot check: the master database") and str(closed[0]) in err


def test_grace_is_a_few_times_the_p99_squeal_measures(tmp_path):
    buckets = {0.1: 50, 0.25: 90, 0.5: 100, float("inf"): 100}
    assert quantile(0.99, buckets) == pytest.approx(0.25 + 0.25 * 9 / 10)
    assert quantile(0.99, {1.0: 0, float("inf"): 0}) is None

    body = (
        "\n".join(
            [
                "# HELP squeal_invalidation_latency_seconds x",
                "# TYPE squeal_invalidation_latency_seconds histogram",
                *(
                    f'squeal_invalidation_latency_seconds_bucket{{flow="{f}",le="{le}"}} {n}'
                    for f in ("a", "b")
                    for le, n in (("0.5", 40), ("1.0", 50), ("+Inf", 50))
                ),
                *(f'squeal_invalidation_latency_seconds_count{{flow="{f}"}} 50' for f in ("a", "b")),
            ]
        ).encode()
        + b"\n"
    )

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        topo = router_config.loads(
            topology(
                db="app",
                port=1,
                ra=2,
                rb=3,
                ma="127.0.0.1:4",
                mb="127.0.0.1:5",
                metrics=server.server_address[1],
            )
        )
        grace, source = measured_grace(topo)
    finally:
        server.shutdown()
    p99 = 0.5 + 0.5 * (99 - 80) / 20  # 99th of 100 observations: in the (0.5, 1.0] bucket
    assert grace == pytest.approx(3 * p99) and "p99" in source
    assert measured_grace(topo) == (DEFAULT_GRACE, "default: no squeal daemon's latency histogram was readable")
