"""The state dir of a local deployment: what `up` recorded (components.json) and where each part keeps its files.

The supervisor rewrites components.json after every start, exit and stop; `status`, `down`, `stop|start|restart`
and the other `squealctl` commands read it, so they work from any later shell.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ops.harness import HarnessError


@dataclass
class Component:
    """One running process, as `squealctl status --json` reports it."""

    role: str
    region: str
    cluster: str | None
    pool: str | None
    pid: int
    address: str
    log: str
    cmdline: list[str]
    metrics: str | None = None  # host:port serving Prometheus /metrics, if the component has one
    name: str = ""  # how `status` lists it and `stop|start|restart` take it: router/east-a/0, squeal/east
    restarts: int = 0  # times the supervisor restarted it after an exit nobody asked for
    stopped: bool = False  # held down by `squealctl stop` until `squealctl start`
    instance: str | None = None  # a pool's worker's name, or the extra replica's (a copy of the region)
    shard: str | None = None  # a MariaDB copy of a topology with [shards]: the shard it holds


class StateDir:
    """The files of the deployment tracked in `state_dir`."""

    def __init__(self, state_dir: str | Path) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.state_file = self.state_dir / "components.json"

    def _recorded(self, corrupt: str = "") -> dict | None:
        """components.json as written (None before `up` and after `down`); `corrupt`: advice after the error."""
        if not self.state_file.exists():
            return None
        try:
            return json.loads(self.state_file.read_text())
        except json.JSONDecodeError as e:
            raise HarnessError(f"{self.state_file}: corrupt state file ({e}){corrupt}") from e

    def components(self) -> list[Component]:
        data = self._recorded("; stop processes by hand")
        return [Component(**c) for c in data["components"]] if data is not None else []

    def supervisor(self) -> Component | None:
        """The supervisor process `up` left running (None before `up` or for a deployment recorded without one)."""
        data = self._recorded()
        record = ((data.get("supervisors") or [None]) if data is not None else [None])[0]
        if not record:
            return None
        return Component(**{k: v for k, v in record.items() if k in Component.__dataclass_fields__})

    def component(self, name: str) -> Component:
        """The recorded component called `name` (as `status` lists it), or an error naming the valid ones."""
        components = self.components()
        for c in components:
            if c.name == name:
                return c
        if not components:
            raise HarnessError(f"no deployment in {self.state_dir} (run `squealctl up` first)")
        raise HarnessError(f"unknown component {name!r}; valid names: {', '.join(c.name for c in components)}")

    def recorded_topology(self) -> str | None:
        """The topology file the last `up` recorded, while its components are recorded (until `down`)."""
        data = self._recorded()
        return data.get("topology") if data is not None else None

    def save(self, components: list[Component], topology: str, supervisor: dict | None = None) -> None:
        """Rewrite components.json at once (the supervisor does, after every start, exit and stop). The
        supervisor's record is a component-like object in a list of its own (`supervisors`: one, or none), so a
        reader that wants it as a scrape target adds it to `components` with `+` (monitoring/prometheus.py)."""
        doc = {
            "topology": topology,
            "supervisors": [supervisor] if supervisor else [],
            "components": [asdict(c) for c in components],
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2))
        os.replace(tmp, self.state_file)

    @property
    def control_socket(self) -> Path:
        """The supervisor's control socket (`stop|start|restart NAME`): in the state dir, or in /tmp when that
        path is too long for a Unix socket (108 bytes)."""
        path = self.state_dir / "supervisor.sock"
        if len(os.fsencode(path)) < 100:
            return path
        digest = hashlib.sha1(os.fsencode(self.state_dir)).hexdigest()[:16]
        return Path(f"/tmp/squeal-supervisor-{os.getuid()}-{digest}.sock")

    @property
    def tls_topology(self) -> Path:
        """The topology `up --tls` runs: the file it was given plus `[tls]` (`with_tls`)."""
        return self.state_dir / "topology-tls.toml"

    def topology(self, given: str | Path | None) -> str | None:
        """The topology file a command about this deployment reads: `given` (None: the one `up` recorded), except
        that the file `up --tls` was given means the TLS copy made of it, which the deployment runs — a plaintext
        reading of it would dial TLS-only ports in plaintext."""
        recorded = self.recorded_topology()
        if given is None:
            return recorded
        source = self.tls_topology.with_suffix(".source")
        if (
            recorded is not None
            and Path(recorded) == self.tls_topology
            and source.exists()
            and Path(given).resolve() == Path(source.read_text())
        ):
            return recorded
        return str(given)

    def squeal_state_dir(self, region: str, instance: str | None = None) -> Path:
        """Where `up` has the region's squeal daemon keep its datamarkers and pid file (`squealctl replay`); a
        pool's worker keeps only its pid file and requests there (its region's markers are in ZooKeeper)."""
        if instance is not None:
            return self.state_dir / "squeal" / f"instance-{instance}"
        return self.state_dir / "squeal" / f"markers-{region}"
