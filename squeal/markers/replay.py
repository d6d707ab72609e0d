"""Replay: rewind flows' datamarkers and tell the region's running daemon, and only that daemon.

Shared by `squeal replay` (a daemon's own --state-dir) and `squealctl replay` (the daemon `squealctl up`
started, whose markers live in the deployment's state dir). A region with a pool of squeal workers keeps its
markers in ZooKeeper: there a replay is a request znode beside the shard's markers, which the shard's owner takes at
its next checkpoint (`replay_zookeeper`), whichever worker owns it and wherever it runs; no state dir, no pid.

A pid file can be stale and its pid reused, so
a pid is signalled only after /proc shows it runs `squeal run --region R` on the same state dir; the check
and the signal go through one pidfd, so the process checked is the process signalled. Every failure is a
`ReplayError` with a one-line message naming the path, flow or pid, and nothing is written or signalled
unless the whole request can be served.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import router_config
from squeal.delivery.flows import flow_names
from squeal.markers.datamarkers import FileDatamarkerStore
from squeal.read import gtid as g

if TYPE_CHECKING:
    from squeal.markers.zkstore import ShardMarkerStore

ALL_FLOWS = "all"


class ReplayError(RuntimeError):
    """A replay request that was refused or failed; the message is one line.

    `code` is the exit status: 2 for a request that names no such region, flow or GTID (as squeal's other
    configuration errors), 1 when the state dir or the daemon does not allow it.
    """

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def add_replay_options(p: argparse.ArgumentParser) -> None:
    """--region/--flow/--from, the same for `squeal replay` and `squealctl replay`."""
    p.add_argument("--region", required=True, help="the region whose daemon owns the flow")
    p.add_argument(
        "--shard", default=None, help="with [shards]: the shard whose flow to rewind (each shard has its own markers)"
    )
    p.add_argument(
        "--flow",
        required=True,
        help=f'a cluster name of the region, "regional", or "{ALL_FLOWS}" (every flow of the region, e.g. after '
        "data loss)",
    )
    p.add_argument(
        "--from",
        dest="from_gtid",
        required=True,
        metavar="GTID",
        help="re-send everything after this GTID position (D-S-N[,D-S-N...])",
    )


def pid_file(state_dir: Path, region: str) -> Path:
    """Where `squeal run` writes its pid (squeal.shard.daemon.Daemon._pid_path)."""
    return state_dir / f"squeal-{region}.pid"


def _cmdline(pid: int) -> list[str] | None:
    """The pid's argv, or None if it is not running (gone, or a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    if stat.rpartition(")")[2].split()[:1] == ["Z"]:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]] if raw else []


def _option(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1 :]
    return None


def daemon_problem(pid: int, argv: list[str], region: str, state_dir: Path) -> str | None:
    """Why `argv` (pid's command line) is not `squeal run --region <region>` on `state_dir`; None if it is."""
    shown = " ".join(argv)[:120] or "a kernel thread"
    # the `squeal` script (after its interpreter, for a shebang), or `python -m squeal.cli`
    at = next((i for i, a in enumerate(argv) if Path(a).name == "squeal" or a == "squeal.cli" and i), None)
    words = [a for a in argv[at + 1 :] if not a.startswith("-")] if at is not None else []
    if at is None or words[:1] != ["run"]:
        return f"it runs `{shown}`, not a squeal daemon"
    rest = argv[at + 1 :]
    theirs = _option(rest, "--region")
    if theirs != region:
        return f"it is the squeal daemon of region {theirs}, not {region} (`{shown}`)"
    their_dir = _option(rest, "--state-dir")
    if their_dir is not None:
        if not os.path.isabs(their_dir):
            try:
                their_dir = os.path.join(os.readlink(f"/proc/{pid}/cwd"), their_dir)
            except OSError as e:
                return f"cannot resolve its relative --state-dir {their_dir} ({e.strerror})"
        if Path(their_dir).resolve() != state_dir.resolve():
            return f"it keeps its datamarkers in {their_dir}, not {state_dir}"
    return None


def _find_daemon(candidates: list[tuple[int, str]], region: str, state_dir: Path) -> tuple[int, int | None] | None:
    """(pid, pidfd) of the first candidate that is a live squeal daemon for `region` on `state_dir`.

    None when no candidate is running. Raises ReplayError when one runs but is something else.
    """
    refused: list[str] = []
    for pid, source in candidates:
        fd: int | None = None
        with contextlib.suppress(OSError, AttributeError):  # no pidfd (old kernel): check and signal by pid
            fd = os.pidfd_open(pid)
        if fd is None and not Path(f"/proc/{pid}").exists():
            continue
        why: str | None
        try:
            argv = _cmdline(pid)
        except OSError as e:  # e.g. /proc mounted with hidepid: what we cannot check we do not signal
            argv, why = [], f"cannot read /proc/{pid}/cmdline ({e.strerror})"
        else:
            why = None if argv is None else daemon_problem(pid, argv, region, state_dir)
        if argv is not None and why is None:
            return pid, fd
        if fd is not None:
            os.close(fd)
        if argv is not None:
            refused.append(f"pid {pid} (from {source}): {why}")
    if refused:
        raise ReplayError(
            f"{'; '.join(refused)}; not signalled, nothing written (if the squeal daemon of region {region} is "
            "gone, that pid is stale: remove the pid file, or `squealctl down` a deployment, and replay again)"
        )
    return None


def replay(
    topo: router_config.Topology,
    region_name: str,
    flow: str,
    from_gtid: str,
    state_dir: str | Path,
    pids: Iterable[tuple[int, str]] = (),
    shard: str | None = None,
) -> list[str]:
    """Rewind `flow` (or every flow, for "all") of the region to `from_gtid` in `state_dir` and SIGHUP the daemon.

    `pids`: (pid, where it came from) of the daemon as someone recorded it, checked before the pid file.
    Returns the lines to print; raises ReplayError (nothing signalled) when the request cannot be served.
    """
    try:
        region = topo.region(region_name)
    except KeyError as e:
        raise ReplayError(e.args[0], code=2) from e
    names = flow_names(region)
    if flow == ALL_FLOWS:
        flows = names
    elif flow in names:
        flows = [flow]
    else:
        raise ReplayError(
            f"region {region.name} has no flow {flow!r} (flows: {', '.join(names)}, or {ALL_FLOWS})", code=2
        )
    try:
        position = g.format_position(g.parse_position(from_gtid))
    except g.GtidError as e:
        raise ReplayError(f"--from: {e}", code=2) from e
    shard = check_shard(topo, shard)
    if region.squeal_instances:
        return replay_zookeeper(topo, region.name, flows, position, shard)
    state = Path(state_dir)
    if not state.is_dir():
        raise ReplayError(
            f"marker dir {state} does not exist: no squeal daemon of region {region.name} keeps its datamarkers "
            "there (wrong state dir?)"
        )
    candidates = list(pids)
    pid_path = pid_file(state, region.name)
    with contextlib.suppress(FileNotFoundError, ValueError):
        candidates.append((int(pid_path.read_text().strip()), str(pid_path)))
    by_pid: dict[int, str] = {}
    for pid, source in candidates:
        by_pid.setdefault(pid, source)
    daemon = _find_daemon(list(by_pid.items()), region.name, state)

    store = FileDatamarkerStore(state / "shards" / shard if shard else state)
    lines = []
    for name in flows:
        try:
            old: str | None = store.load(name)
        except (ValueError, KeyError, OSError):
            old = "(unreadable)"
        try:
            store.save(name, position)
            store.request_replay(name, position)
        except OSError as e:
            raise ReplayError(f"cannot write the datamarker of flow {name} in {state}: {e.strerror}") from e
        lines.append(
            f"flow {name}{f' of shard {shard}' if shard else ''}: datamarker {old or '(none)'} -> "
            f"{position or '(start of the binlog)'}"
        )

    if daemon is not None:
        pid, fd = daemon
        try:
            if fd is not None:
                signal.pidfd_send_signal(fd, signal.SIGHUP)
            else:
                os.kill(pid, signal.SIGHUP)
        except ProcessLookupError:
            daemon = None
        finally:
            if fd is not None:
                os.close(fd)
        if daemon is not None:
            lines.append(f"told the running daemon of region {region.name} (pid {pid}) to replay now")
            return lines
    lines.append(
        f"no squeal daemon of region {region.name} is running: the replay is recorded in {state}, and the next "
        f"daemon started on it applies it (`squealctl up`, or `squeal run ... --region {region.name} --state-dir "
        f"{state}`)"
    )
    return lines


ZK_CONNECT_TIMEOUT = 5.0
# kazoo's logger for operator commands: only its errors (connection attempts are summed up by ReplayError).
_QUIET_KAZOO = logging.getLogger("squeal.markers.replay.kazoo")
_QUIET_KAZOO.setLevel(logging.ERROR)


def check_shard(topo: router_config.Topology, shard: str | None) -> str | None:
    """The shard a request names: None without [shards]; with [shards], one is required (ReplayError, exit 2)."""
    if not topo.sharded:
        if shard is not None:
            raise ReplayError(f"{topo.source} has no [shards]: leave --shard out", code=2)
        return None
    names = [s.name for s in topo.shards]
    if shard is None:
        raise ReplayError(f"{topo.source} has shards ({', '.join(names)}): name one with --shard", code=2)
    if shard not in names:
        raise ReplayError(f"no shard {shard!r} in {topo.source} (have: {', '.join(names)})", code=2)
    return shard


@contextlib.contextmanager
def zookeeper_store(
    topo: router_config.Topology, region: str, timeout: float = ZK_CONNECT_TIMEOUT, shard: str | None = None
):
    """An unfenced `ShardMarkerStore` of a pooled region's shard (for operator requests); ReplayError (exit 1)
    naming the servers and the topology key when ZooKeeper does not answer within `timeout`."""
    from kazoo.client import KazooClient

    from squeal.markers.zkstore import ShardMarkerStore, ZooKeeperUnavailable
    from squeal.pool.zookeeper import client_options, ha_marker_dir

    zk = topo.zookeeper
    if zk is None:  # the loader refuses instances without [zookeeper]
        raise ReplayError(f"{topo.source}: region {region} has squeal instances but no [zookeeper] section", code=2)
    # The quiet logger: kazoo's per-attempt warnings would bury the one line that matters.
    client = KazooClient(
        hosts=zk.hosts,
        timeout=zk.session_timeout_s,
        connection_retry={"max_tries": 0},
        logger=_QUIET_KAZOO,
        **client_options(topo),
    )
    try:
        client.start(timeout=timeout)
    except Exception as e:
        client.close()
        raise ReplayError(
            f"cannot reach ZooKeeper {zk.hosts} (zookeeper.servers in {topo.source}) within {timeout:g}s: "
            f"{e or type(e).__name__}; region {region}'s datamarkers live there: nothing requested"
        ) from e
    try:
        name = shard or topo.shards[0].name  # the shard's own znodes, whichever worker owns it
        legacy = ha_marker_dir(zk.root, region, shard)  # (what an HA leader left: the start, until overwritten)
        yield ShardMarkerStore(client, zk.root, region, name, timeout=timeout, legacy=legacy)
    except ZooKeeperUnavailable as e:
        raise ReplayError(f"{e}; the request may not have been recorded: run the command again") from e
    finally:
        client.stop()
        client.close()


def zookeeper_owner(store: ShardMarkerStore) -> str | None:
    """Which worker owns the store's shard now (its `owner` znode), None when nobody does."""
    import json

    from kazoo.exceptions import NoNodeError

    try:
        data, _ = store.client.get(f"{store.data}/owner")
    except NoNodeError:
        return None
    try:
        return json.loads(data.decode()).get("worker")
    except ValueError:
        return "?"


def replay_zookeeper(
    topo: router_config.Topology, region: str, flows: list[str], position: str, shard: str | None = None
) -> list[str]:
    """Leave a replay request per flow in ZooKeeper (`replay/<flow>` beside the shard's markers); the shard's owner
    applies it at its next checkpoint (rewinds the flow, re-reads it through a catch-up reader, moves the marker by
    compare-and-set). The marker itself is left to the owner: a write from here would fail its next compare-and-set."""
    lines = []
    with zookeeper_store(topo, region, shard=shard) as store:
        markers = store.positions()
        for name in flows:
            store.request_replay(name, position)
            lines.append(
                f"flow {name}: replay from {position or '(start of the binlog)'} requested in "
                f"{store.dir}/replay/{name} (datamarker now {markers.get(name) or '(none)'})"
            )
        owner = zookeeper_owner(store)
    if owner:
        lines.append(
            f"the owner of shard {store.shard} of region {region}, worker {owner}, applies it at its next checkpoint "
            "(within a second); its /healthz shows the flow catching up"
        )
    else:
        lines.append(f"no squeal worker owns shard {store.shard} of region {region} now: its next owner applies it")
    return lines
