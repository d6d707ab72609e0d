"""`squealctl status` and ZooKeeper: with `[tls]` (issue 25, item 6) ZooKeeper's client port is TLS only, so
`srvr` must be asked over TLS, verifying the server against the topology's CA; with or without, status asks
`srvr` and never just connects (which costs the server a stack trace in its log each time)."""

from __future__ import annotations

import json
from pathlib import Path

import psutil

from ops import tls
from ops.harness import ZooKeeper, zookeeper_mode
from ops.local import Deployment
from tests.binaries import needs_binary

pytestmark = needs_binary(Path("/usr/share/java/netty-codec.jar").exists(), "libnetty-java not installed")

REPO = Path(__file__).resolve().parents[2]


def _record(state: Path, topology: Path, zk: ZooKeeper) -> None:
    """A deployment's record of one ZooKeeper server, as `squealctl up` writes it."""
    state.mkdir()
    proc = psutil.Process(zk.proc.pid)
    record = {
        "role": "zookeeper",
        "region": "east",
        "cluster": None,
        "pool": None,
        "pid": proc.pid,
        "address": zk.address,
        "log": str(zk.log_file),
        "cmdline": proc.cmdline(),
        "name": "zookeeper/1",
    }
    (state / "components.json").write_text(json.dumps({"topology": str(topology), "components": [record]}))


def _topology_with(zk: ZooKeeper, path: Path, tls_section: str = "") -> Path:
    text = (REPO / "examples" / "local.toml").read_text()
    text = text.replace(
        'servers = ["127.0.0.1:12181", "127.0.0.1:12182", "127.0.0.1:12183"]\n'
        "peer_ports = [[12281, 12381], [12282, 12382], [12283, 12383]]\n",
        f'servers = ["{zk.address}"]\n',
    )
    path.write_text(tls_section + text)
    return path


def test_status_asks_a_tls_only_zookeeper_over_tls(processes, tmp_path):
    d = tmp_path / "tls"
    ca = tls.make_ca(d)
    for name in ("zookeeper", "squeal"):
        tls.issue(ca, d, name)
    zk = processes.add(
        ZooKeeper(workdir=tmp_path / "zk", ssl_cert=d / "zookeeper.crt", ssl_key=d / "zookeeper.key", ssl_ca=ca.cert)
    )
    assert zookeeper_mode(zk.address) is None  # plaintext `srvr` gets nothing from a TLS-only port
    topology = _topology_with(zk, tmp_path / "topology.toml", '[tls]\ndir = "tls"\nrequire = true\n\n')
    _record(tmp_path / "state", topology, zk)
    (row,) = Deployment(tmp_path / "state").status()
    assert row["running"] and row["answering"], row
    assert row["mode"] == "standalone" and row["serving"] and row["healthy"], row


def test_status_leaves_no_stack_trace_in_zookeepers_log(processes, tmp_path):
    zk = processes.add(ZooKeeper(workdir=tmp_path / "zk"))
    _record(tmp_path / "state", _topology_with(zk, tmp_path / "topology.toml"), zk)
    before = zk.log_file.read_text()
    for _ in range(3):
        (row,) = Deployment(tmp_path / "state").status()
        assert row["answering"] and row["mode"] == "standalone", row
    zk.stop()  # its log is complete once it has stopped
    added = zk.log_file.read_text()[len(before) :]
    assert "Exception" not in added, added
