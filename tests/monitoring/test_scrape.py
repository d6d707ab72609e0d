"""monitoring.scrape reads Prometheus text with prometheus_client's parser and memcached `stats` with pymemcache.

The Prometheus side is checked against a real exposition (prometheus_client's own HTTP server, the code every
squeal component serves /metrics with): a labelled counter and a labelled histogram come back under the names and
`name{labels}` keys the experiments and the dashboard read. The memcached side runs against a real memcached.
"""

from __future__ import annotations

import socket
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, start_http_server

import router_config
from loadtest.experiments.batching import histogram_median
from monitoring.scrape import (
    memcached_stats,
    parse_prometheus,
    prometheus_values,
    sample_key,
    scrape_memcached,
    scrape_prometheus,
)
from ops import tls as pki
from ops.harness import free_port, memcached_command


@pytest.fixture
def exposition():
    """A registry shaped like squeal's: a counter and a histogram per flow, one label value needing escapes."""
    registry = CollectorRegistry()
    sent = Counter("squeal_deletes_sent", "deletes sent", ["flow"], registry=registry)
    per_write = Histogram(
        "squeal_deletes_per_write", "deletes per write", ["flow"], buckets=(1, 4, 16, 64), registry=registry
    )
    sent.labels("east-a").inc(7)
    sent.labels('we"ird\\flow').inc(2)
    for n in (1, 3, 3, 10, 40):
        per_write.labels("east-a").observe(n)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield registry, f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_counter_and_histogram_samples_keep_their_wire_names_and_labels(exposition):
    _, address = exposition
    samples = {(name, tuple(labels.items())): value for name, labels, value in scrape_prometheus(address)}

    assert samples[("squeal_deletes_sent_total", (("flow", "east-a"),))] == 7.0
    assert samples[("squeal_deletes_sent_total", (("flow", 'we"ird\\flow'),))] == 2.0  # unescaped
    assert ("squeal_deletes_sent_created", (("flow", "east-a"),)) in samples
    buckets = {labels[1][1]: v for (name, labels), v in samples.items() if name == "squeal_deletes_per_write_bucket"}
    assert buckets == {"1.0": 1.0, "4.0": 3.0, "16.0": 4.0, "64.0": 5.0, "+Inf": 5.0}  # `le` last, as exposed
    assert samples[("squeal_deletes_per_write_count", (("flow", "east-a"),))] == 5.0
    assert samples[("squeal_deletes_per_write_sum", (("flow", "east-a"),))] == 57.0


def test_keys_are_the_exposition_lines_so_flow_readers_see_what_they_always_saw(exposition):
    registry, address = exposition
    values = prometheus_values(address)
    # every sample line of the text is `key value`: the keys are exactly what precedes the value
    text = generate_latest(registry).decode()
    lines = [line.rpartition(" ") for line in text.splitlines() if line and not line.startswith("#")]
    assert set(values) == {key for key, _, _ in lines}
    for key, _, value in lines:
        if "_created" not in key:  # (a timestamp: read again, the same)
            assert values[key] == float(value), key
    assert values['squeal_deletes_sent_total{flow="east-a"}'] == 7.0
    assert values['squeal_deletes_sent_total{flow="we\\"ird\\\\flow"}'] == 2.0
    assert values['squeal_deletes_per_write_bucket{flow="east-a",le="+Inf"}'] == 5.0
    assert histogram_median(values, "east-a") == 4.0  # the third of five observations lies in (1, 4]


def test_sample_key_without_labels_is_the_bare_name():
    assert sample_key("squeal_halted", {}) == "squeal_halted"
    assert [sample_key(n, lab) for n, lab, _ in parse_prometheus("# TYPE up gauge\nup 1\n")] == ["up"]


def test_malformed_text_is_a_value_error():
    with pytest.raises(ValueError):
        list(parse_prometheus("squeal_x{flow=east-a} 1\n"))


def test_memcached_stats_from_a_real_memcached(memcached_factory):
    server = memcached_factory()
    address = (server.host, server.port)
    assert memcached_command(address, b"set present 0 0 1\r\nx\r\n") == b"STORED"
    memcached_command(address, b"get present\r\n")
    memcached_command(address, b"get absent\r\n")

    stats = memcached_stats(server.address)
    assert stats["get_hits"] == 1.0 and stats["get_misses"] == 1.0
    assert stats["curr_items"] == 1.0 and stats["cmd_set"] == 1.0
    assert stats["pid"] == float(server.pid)
    assert isinstance(stats["rusage_user"], float)
    assert "version" not in stats  # not a number
    charted = {name: value for name, _, value in scrape_memcached(server.address)}
    assert charted["memcached_get_hits"] == 1.0 and charted["memcached_curr_items"] == 1.0
    assert set(charted) <= {f"memcached_{f}" for f in stats}


def _one_shot_server(reply: bytes | None) -> tuple[str, threading.Thread]:
    """A TCP server that answers one connection with `reply` (None: closes without a word)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(100)
                if reply is not None:
                    conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"127.0.0.1:{listener.getsockname()[1]}", thread


@pytest.mark.parametrize("reply", [None, b"ERROR\r\n", b"SERVER_ERROR busy\r\n", b"STAT pid 1\r\n"])
def test_a_server_that_does_not_answer_stats_is_down(reply):
    """Every caller (the scraper, gutter health, the warm-up controller) catches OSError and counts it down."""
    address, thread = _one_shot_server(reply)
    with pytest.raises(OSError):
        memcached_stats(address, timeout=0.5)
    thread.join(5)


def test_nothing_listening_is_down():
    with pytest.raises(OSError):
        memcached_stats(f"127.0.0.1:{free_port()}", timeout=0.5)


def test_memcached_stats_over_tls_from_memcached_dash_z(memcached_factory, tmp_path):
    """A topology with [tls] runs memcached -Z: its stats are read over TLS, verified against the CA."""
    d = tmp_path / "tls"
    ca = pki.make_ca(d)
    pair = pki.issue(ca, d, "memcached")
    server = memcached_factory(tls=(pair.cert, pair.key), ssl_ca=ca.cert)
    ctx = router_config.verifying_context(str(ca.cert))
    assert memcached_command((server.host, server.port), b"set k 0 0 1\r\nx\r\n", tls=ctx) == b"STORED"
    stats = memcached_stats(server.address, tls=ctx)
    assert stats["cmd_set"] == 1.0 and stats["pid"] == float(server.pid)
    with pytest.raises(OSError):  # plaintext to a TLS-only port: no stats
        memcached_stats(server.address, timeout=2)
