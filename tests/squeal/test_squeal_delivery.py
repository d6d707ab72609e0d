"""squeal end to end against real MariaDB and memcached: the right keys disappear from every cluster.

One daemon and two clusters (each its own memcached) are shared by the module; each test waits for a
"fence" change to be invalidated before it looks for keys that must still be there.
"""

from __future__ import annotations

import base64
import gzip
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from squeal_helpers import SquealEnv, scrape, wait_gone


@pytest.fixture(scope="module", params=["native", "python"])
def env(primary, tmp_path_factory, request) -> SquealEnv:
    """Every test runs with both deliveries (`[squeal] delivery`): the native thread and the Python senders."""
    e = SquealEnv(tmp_path_factory.mktemp("delivery"), primary, delivery=request.param).start()
    yield e
    e.stop()


def cache_all(env: SquealEnv, keys: list[str]) -> None:
    for c in env.caches:
        c.set_many(keys)


def assert_cached_everywhere(env: SquealEnv, keys: list[str]) -> None:
    for c in env.caches:
        assert c.present(keys) == set(keys), f"memcached {c.addr[1]} lost keys it should still have"


def test_insert_update_delete(env: SquealEnv) -> None:
    keys = ["user:1", "user:email:one@x"]
    cache_all(env, keys)
    env.sql("INSERT INTO users VALUES (1, 'one@x', 'One')")
    wait_gone(env.caches, keys)

    cache_all(env, keys)
    env.sql("UPDATE users SET name = 'Uno' WHERE id = 1")
    wait_gone(env.caches, keys)

    cache_all(env, keys)
    env.sql("DELETE FROM users WHERE id = 1")
    wait_gone(env.caches, keys)


def test_multi_row_and_multi_statement_transactions(env: SquealEnv) -> None:
    keys = [f"user:{i}" for i in range(10, 20)] + [f"post:{i}" for i in range(10, 13)] + ["feed:10", "feed:11"]
    untouched = ["user:99", "post:99", "feed:99"]
    cache_all(env, keys + untouched)
    with env.connect(autocommit=False) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO users VALUES " + ", ".join(f"({i}, 'u{i}@x', 'n')" for i in range(10, 20)))
        cur.execute("INSERT INTO posts VALUES (10, 10, 'a'), (11, 11, 'b')")
        cur.execute("INSERT INTO posts VALUES (12, 10, 'c')")
        conn.commit()
    wait_gone(env.caches, keys)
    env.fence()
    assert_cached_everywhere(env, untouched)


def test_rollback_sends_nothing(env: SquealEnv) -> None:
    keys = ["user:30", "user:email:thirty@x"]
    cache_all(env, keys)
    with env.connect(autocommit=False) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO users VALUES (30, 'thirty@x', 'x')")
        cur.execute("UPDATE users SET name = 'y' WHERE id = 30")
        conn.rollback()
    env.fence()
    assert_cached_everywhere(env, keys)


def test_delete_only_after_commit(env: SquealEnv) -> None:
    """While a transaction is open nothing is deleted; its keys go once it commits."""
    keys = ["user:31"]
    cache_all(env, keys)
    conn = env.connect(autocommit=False)
    with conn.cursor() as cur:
        cur.execute("INSERT INTO users VALUES (31, 'x31@x', 'x')")
        env.fence()
        assert_cached_everywhere(env, keys)
        conn.commit()
    conn.close()
    wait_gone(env.caches, keys)


def test_update_of_key_column_deletes_old_and_new_key(env: SquealEnv) -> None:
    env.sql("INSERT INTO users VALUES (40, 'old@x', 'n')")
    env.fence()
    keys = ["user:40", "user:email:old@x", "user:email:new@x"]
    cache_all(env, keys)
    env.sql("UPDATE users SET email = 'new@x' WHERE id = 40")
    wait_gone(env.caches, keys)


def test_mcd_comment_keys(env: SquealEnv) -> None:
    """Keys in a /* mcd: */ comment (sent as written by PyMySQL), on a table with no rule at all."""
    plain = ["profile:7", "timeline:7"]
    spaced = "name with space"  # not a valid memcached key: deleted in base64 form (the `b` flag)
    token = base64.b64encode(spaced.encode()).decode()
    cache_all(env, plain + ["profile:8"])
    for c in env.caches:
        c.sock.sendall(f"ms {token} 1 b\r\nx\r\n".encode())
        assert c._line() == b"HD"
    env.sql(f"INSERT INTO other VALUES (7, 'v') /* mcd:profile:7, timeline:7,{spaced} */")
    wait_gone(env.caches, plain)
    env.fence()
    for c in env.caches:
        c.sock.sendall(f"mg {token} b v\r\n".encode())
        assert c._line() == b"EN", "the base64-form key was not deleted"
    assert_cached_everywhere(env, ["profile:8"])


def test_regional_keys_go_only_to_the_regional_flow(env: SquealEnv) -> None:
    # Here the "routers" are the clusters' memcacheds themselves, so the regional flow's deletes land on the
    # first router of the region (cluster c0) and never on c1 through c1's cluster flow.
    cache_all(env, ["regional:5", "user:50"])
    env.sql("INSERT INTO users VALUES (50, 'r@x', 'n') /* mcd:regional:5 */")
    wait_gone(env.caches, ["user:50"])
    wait_gone(env.caches[:1], ["regional:5"])
    env.fence()
    assert env.caches[1].has("regional:5"), "a regional key was sent to a cluster flow"


def test_unknown_tables_are_ignored_cheaply(env: SquealEnv) -> None:
    env.fence()
    before = scrape(env.daemon.port)
    rows_before = before.get('squeal_rows_total{reader="live"}', 0)
    tx_before = before.get('squeal_transactions_total{reader="live"}', 0)
    cache_all(env, ["other:1", "user:60"])
    with env.connect() as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO other VALUES (%s, 'v')", [(i,) for i in range(100, 200)])
        cur.execute("UPDATE other SET v = 'w' WHERE id >= 100")
    env.fence()
    after = scrape(env.daemon.port)
    # Their rows are never decoded (rows of the fence: 1), yet the transactions still move the datamarkers.
    assert after['squeal_rows_total{reader="live"}'] - rows_before == 1
    assert after['squeal_transactions_total{reader="live"}'] - tx_before >= 102
    assert_cached_everywhere(env, ["other:1"])


def test_metrics_page_speaks_prometheus_text_openmetrics_and_gzip_without_created_series(env: SquealEnv) -> None:
    """The daemon's /metrics as Prometheus asks for it: text by default, OpenMetrics when its Accept asks, gzip
    when accepted; and no `*_created` series (a sixth of the samples, read by nothing)."""
    env.fence()
    url = f"http://127.0.0.1:{env.daemon.port}/metrics"

    def get(**headers: str) -> tuple[dict[str, str], bytes]:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return {k.lower(): v for k, v in r.headers.items()}, r.read()

    headers, body = get()
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    families = {f.name for f in text_string_to_metric_families(text)}
    assert {"squeal_rows", "squeal_invalidation_latency_seconds"} <= families
    assert "_created" not in text

    headers, body = get(Accept="application/openmetrics-text; version=1.0.0")
    assert headers["content-type"].startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")

    headers, body = get(**{"Accept-Encoding": "gzip"})
    assert headers.get("content-encoding") == "gzip"
    assert b"squeal_rows_total" in gzip.decompress(body)


def test_alter_table_mid_stream(env: SquealEnv) -> None:
    env.sql("INSERT INTO posts VALUES (70, 7, 't')")
    env.sql("ALTER TABLE posts ADD COLUMN body TEXT AFTER id")
    keys = ["post:70", "feed:7", "feed:8"]
    cache_all(env, keys)
    env.sql("UPDATE posts SET author_id = 8, body = 'b' WHERE id = 70")
    wait_gone(env.caches, keys)

    env.sql("ALTER TABLE posts DROP COLUMN title")
    cache_all(env, keys)
    env.sql("UPDATE posts SET author_id = 7 WHERE id = 70")
    wait_gone(env.caches, keys)
    env.sql("ALTER TABLE posts DROP COLUMN body")
    cache_all(env, keys)
    env.sql("DELETE FROM posts WHERE id = 70")
    wait_gone(env.caches, ["post:70", "feed:7"])
    env.fence()
    assert_cached_everywhere(env, ["feed:8"])  # the row's author is 7 now
    assert "Traceback" not in env.log()
