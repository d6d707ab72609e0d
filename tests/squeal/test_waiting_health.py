"""Issue 27, item 6: a pool worker that waits for ZooKeeper at start-up serves `/healthz` from
the start — unhealthy, naming the ensemble it waits for — instead of looking dead until ZooKeeper answers.

Nobody listens on the topology's ZooKeeper ports; the process is ready for the harness once `/healthz` answers
(`SquealDaemon.ready`), which today happens only after ZooKeeper answered."""

from __future__ import annotations

from pathlib import Path

from squeal_helpers import create_schema, healthz, topology_text, unique_db

from ops.harness import MariaDB, SquealDaemon, free_port, wait_until


def _topology(primary: MariaDB, tmp_path: Path) -> tuple[Path, str, int]:
    schema = unique_db("waiting")
    create_schema(primary, schema)
    text = topology_text(primary, schema, [free_port()])
    port = free_port()
    text += f'\n[[regions.east.squeal_instances]]\nname = "east-1"\nmetrics_port = {port}\ndatabase = "east"\n'
    servers = [f"127.0.0.1:{free_port()}" for _ in range(3)]  # nobody listens there
    listed = ", ".join(f'"{s}"' for s in servers)
    peer_ports = ", ".join(f"[{free_port()}, {free_port()}]" for _ in servers)
    text += f'\n[zookeeper]\nservers = [{listed}]\npeer_ports = [{peer_ports}]\nroot = "/squeal-waiting"\n'
    path = tmp_path / "topology.toml"
    path.write_text(text)
    return path, ",".join(servers), port


def test_waiting_for_zookeeper_serves_an_unhealthy_healthz_naming_the_ensemble(
    primary: MariaDB, processes, tmp_path: Path
) -> None:
    topology, ensemble, port = _topology(primary, tmp_path)
    daemon = SquealDaemon(topology, "east", port=port, workdir=tmp_path / "squeal", instance="east-1")
    daemon.start_timeout = 15.0  # less than the start-up's ZooKeeper connect time-out (20 s): it still waits
    processes.add(daemon)  # ready = /healthz answers, even with a 503
    waiting = f"waiting for ZooKeeper {ensemble}"

    def naming_it() -> tuple[int, dict] | None:
        status, body = healthz(port)
        return (status, body) if any(waiting in p for p in body["problems"].values()) else None

    status, body = wait_until(naming_it, 10, "/healthz to name the ensemble")
    assert status == 503, body
    assert body["ok"] is False
    assert body["instance"] == "east-1" and body["region"] == "east"
    assert body["state"] == "starting"  # not a member of the pool yet
    assert daemon.proc is not None and daemon.proc.poll() is None  # still waiting, not given up
