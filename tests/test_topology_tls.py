"""The `[tls]` topology section: paths resolved against the file, and each mistake named by its key."""

from __future__ import annotations

from pathlib import Path

import pytest

import router_config
from ops import tls
from router_config import TopologyError
from tests.topologies import ONE_CLUSTER

BASE = ONE_CLUSTER


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    ca = tls.make_ca(d)
    for name in ("squeal", "mariadb"):
        tls.issue(ca, d, name)
    return d


def load(tmp_path: Path, tls_text: str) -> router_config.Topology:
    path = tmp_path / "topo.toml"
    path.write_text(BASE + tls_text)
    return router_config.load(path)


def error(tmp_path: Path, tls_text: str) -> TopologyError:
    with pytest.raises(TopologyError) as e:
        load(tmp_path, tls_text)
    return e.value


def test_no_tls_section_means_plaintext():
    assert router_config.loads(BASE).tls is None


def test_explicit_paths_relative_to_the_topology_file(tmp_path, certs):
    (tmp_path / "pki").symlink_to(certs)
    topo = load(
        tmp_path,
        '[tls]\nca = "pki/ca.crt"\nrequire = true\n[tls.squeal]\ncert = "pki/squeal.crt"\nkey = "pki/squeal.key"\n',
    )
    assert topo.tls.require is True
    assert topo.tls.ca == str(tmp_path / "pki" / "ca.crt")
    assert topo.tls.cert("squeal").key == str(tmp_path / "pki" / "squeal.key")
    assert topo.tls.cert("mariadb") is None


def test_directory_convention(tmp_path, certs):
    topo = load(tmp_path, f'[tls]\ndir = "{certs}"\nrequire = true\n')
    assert topo.tls.ca == str(certs / "ca.crt")
    assert {name for name, _ in topo.tls.certs} == {"squeal", "mariadb"}
    assert topo.tls.cert("mariadb").cert == str(certs / "mariadb.crt")


def test_round_trip_keeps_tls_and_digest(tmp_path, certs):
    topo = load(
        tmp_path,
        f'[tls]\ndir = "{certs}"\nrequire = true\n'
        '[zookeeper]\nservers = ["127.0.0.1:2181"]\ndigest = "squeal:secret"\n',
    )
    again = router_config.loads(router_config.dumps(topo))
    assert again.tls == topo.tls
    assert again.zookeeper.digest == "squeal:secret"


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        (
            '[tls]\nrequire = true\n[tls.squeal]\ncert = "{d}/squeal.crt"\nkey = "{d}/squeal.key"\n',
            "tls.require",
            "needs tls.ca",
        ),
        ('[tls]\nca = "nowhere/ca.crt"\n', "tls.ca", "no such file"),
        (
            '[tls]\nca = "{d}/ca.crt"\n[tls.squeal]\ncert = "{d}/squeal.crt"\n',
            "tls.squeal",
            "missing required key 'key'",
        ),
        (
            '[tls]\nca = "{d}/ca.crt"\n[tls.squeal]\ncert = "{d}/squeal.crt"\nkey = "{d}/nope.key"\n',
            "tls.squeal.key",
            "no such file",
        ),
        ('[tls]\nca = "{d}/ca.crt"\n[tls.sqeal]\ncert = "a"\nkey = "b"\n', "tls.sqeal", "unknown key"),
        ('[tls]\nca = "{d}/ca.crt"\nrequire = "yes"\n', "tls.require", "true or false"),
        ('[tls]\ndir = "{d}/missing"\n', "tls.dir", "no such directory"),
        ("[tls]\nrequire = false\n", "tls", "names no CA and no certificate"),
        ('[zookeeper]\nservers = ["127.0.0.1:2181"]\ndigest = "squeal"\n', "zookeeper.digest", "user:password"),
    ],
)
def test_mistakes_name_the_key(tmp_path, certs, text, key, words):
    e = error(tmp_path, text.replace("{d}", str(certs)))
    assert e.path == key, str(e)
    assert words in e.message, str(e)


def test_key_without_certificate_in_the_directory(tmp_path, certs):
    d = tmp_path / "half"
    d.mkdir()
    (d / "ca.crt").write_bytes((certs / "ca.crt").read_bytes())
    (d / "router.key").write_bytes((certs / "squeal.key").read_bytes())
    e = error(tmp_path, f'[tls]\ndir = "{d}"\n')
    assert e.path == "tls.dir" and "router.key without router.crt" in e.message


def test_every_database_copy_carries_the_tls_settings(tmp_path, certs):
    topo = load(tmp_path, f'[tls]\ndir = "{certs}"\nrequire = true\n')
    assert topo.region("east").database.tls == topo.tls
    assert all(d.tls == topo.tls for sh in topo.shards for d in sh.copies)
