"""An in-memory stand-in for the part of kazoo's `KazooClient` the pool's controller, `Ownership`, `SessionLease`
and `Watched` use: znodes with versions and ephemeral owners, one-shot watches fired at once on the caller's
thread, and multi-operations applied whole or not at all. No server, no threads, no time: the unit tests of the
pool's decisions drive it with a clock of their own (twisted's `task.Clock`).

Only what those callers ask is here; each `*_async` answers at once (`.get(timeout)` returns or raises)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError, RolledBackError

Watch = Callable[[Any], None]


@dataclass
class Stat:
    version: int
    ephemeralOwner: int  # (kazoo ZnodeStat field name)


@dataclass
class _Znode:
    data: bytes
    version: int = 0
    owner: int = 0  # the session of an ephemeral znode, 0 for a persistent one


class Answer:
    """What kazoo's `IAsyncResult` gives: the value, or the exception the call failed with."""

    def __init__(self, call: Callable[[], Any]) -> None:
        try:
            self.value, self.error = call(), None
        except Exception as e:  # noqa: BLE001 - handed to the caller by get(), as kazoo does
            self.value, self.error = None, e

    def get(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class FakeZooKeeper:
    """The ensemble and one session of it (`client_id[0]`: `session`); `as_session(n)` is another client of the
    same ensemble (another worker), sharing its znodes and watches."""

    def __init__(self, session: int = 1, shared: FakeZooKeeper | None = None) -> None:
        self.nodes: dict[str, _Znode] = shared.nodes if shared is not None else {"/": _Znode(b"")}
        self._watches: dict[tuple[str, str], list[Watch]] = shared._watches if shared is not None else {}
        self.client_id = (session, b"")
        self.state = KazooState.CONNECTED
        self.connected = True
        self.hosts = (("fake", 2181),)

    def as_session(self, session: int) -> FakeZooKeeper:
        return FakeZooKeeper(session, shared=self)

    # -- what the test sets up or looks at ----------------------------------------------------------------------

    def put(self, path: str, data: bytes = b"", ephemeral_of: int = 0, fire: bool = True) -> None:
        """Create or overwrite `path` (and its parents), as another client would; `fire=False`: a change whose
        watch has not reached this client yet."""
        if path in self.nodes:
            node = self.nodes[path]
            node.data, node.version = data, node.version + 1
            if fire:
                self._fire(path, "data")
            return
        self._make_parents(path)
        self.nodes[path] = _Znode(data, owner=ephemeral_of)
        if fire:
            self._fire(path, "data")
            self._fire(self._parent(path), "children")

    def data(self, path: str) -> bytes | None:
        node = self.nodes.get(path)
        return None if node is None else node.data

    def version(self, path: str) -> int | None:
        node = self.nodes.get(path)
        return None if node is None else node.version

    # -- kazoo's calls ------------------------------------------------------------------------------------------

    def get_async(self, path: str, watch: Watch | None = None) -> Answer:
        def call() -> tuple[bytes, Stat]:
            node = self._node(path)
            self._watch(path, "data", watch)
            return node.data, Stat(node.version, node.owner)

        return Answer(call)

    def get_children_async(self, path: str, watch: Watch | None = None) -> Answer:
        def call() -> list[str]:
            self._node(path)
            self._watch(path, "children", watch)
            return self._children(path)

        return Answer(call)

    def exists_async(self, path: str, watch: Watch | None = None) -> Answer:
        def call() -> Stat | None:
            self._watch(path, "data", watch)
            node = self.nodes.get(path)
            return None if node is None else Stat(node.version, node.owner)

        return Answer(call)

    def create_async(
        self, path: str, value: bytes = b"", ephemeral: bool = False, makepath: bool = False, **_: Any
    ) -> Answer:
        return Answer(lambda: self._apply([("create", path, value, ephemeral, makepath)])[0])

    def set_async(self, path: str, value: bytes, version: int = -1) -> Answer:
        return Answer(lambda: self._apply([("set", path, value, version)])[0])

    def delete_async(self, path: str, version: int = -1) -> Answer:
        return Answer(lambda: self._apply([("delete", path, version)])[0])

    def transaction(self) -> FakeTransaction:
        return FakeTransaction(self)

    # -- the ensemble -------------------------------------------------------------------------------------------

    def _apply(self, ops: list[tuple[Any, ...]], multi: bool = False) -> list[Any]:
        """Check every operation against the znodes as the earlier ones of the same call leave them, then apply
        all of them or none. A single call raises its failure; a multi-operation answers it in its slot and
        `RolledBackError` in the others, as ZooKeeper does."""
        staged = {p: _Znode(n.data, n.version, n.owner) for p, n in self.nodes.items()}
        results: list[Any] = []
        failure: Exception | None = None
        for op in ops:
            try:
                results.append(self._stage(staged, op))
            except (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError) as e:
                if not multi:
                    raise
                failure = e
                results.append(e)
                break
        if failure is not None:
            return [r if isinstance(r, Exception) else RolledBackError() for r in results] + [
                RolledBackError() for _ in ops[len(results) :]
            ]
        before = set(self.nodes)
        changed = [op[1] for op in ops]
        self.nodes.clear()
        self.nodes.update(staged)
        for path in changed:
            self._fire(path, "data")
            if (path in before) != (path in self.nodes):
                self._fire(self._parent(path), "children")
        return results

    def _stage(self, staged: dict[str, _Znode], op: tuple[Any, ...]) -> Any:
        kind, path = op[0], op[1]
        if kind == "create":
            _, _, value, ephemeral, makepath = op
            if path in staged:
                raise NodeExistsError()
            if self._parent(path) not in staged:
                if not makepath:
                    raise NoNodeError()
                for parent in self._ancestors(path):
                    staged.setdefault(parent, _Znode(b""))
            staged[path] = _Znode(value, owner=self.client_id[0] if ephemeral else 0)
            return path
        node = staged.get(path)
        if node is None:
            raise NoNodeError()
        version = op[-1]
        if version != -1 and version != node.version:
            raise BadVersionError()
        if kind == "set":
            node.data, node.version = op[2], node.version + 1
            return Stat(node.version, node.owner)
        if kind == "check":
            return True
        if any(p.startswith(path + "/") for p in staged):
            raise NotEmptyError()
        del staged[path]
        return True

    def _node(self, path: str) -> _Znode:
        node = self.nodes.get(path)
        if node is None:
            raise NoNodeError()
        return node

    def _children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix) :] for p in self.nodes if p.startswith(prefix) and "/" not in p[len(prefix) :]})

    def _watch(self, path: str, kind: str, watch: Watch | None) -> None:
        if watch is not None:
            self._watches.setdefault((path, kind), []).append(watch)

    def _fire(self, path: str, kind: str) -> None:
        for watch in self._watches.pop((path, kind), []):  # one-shot, as ZooKeeper's
            watch(None)

    def _make_parents(self, path: str) -> None:
        for parent in self._ancestors(path):
            self.nodes.setdefault(parent, _Znode(b""))

    @staticmethod
    def _parent(path: str) -> str:
        return path.rsplit("/", 1)[0] or "/"

    @staticmethod
    def _ancestors(path: str) -> list[str]:
        parts = path.strip("/").split("/")[:-1]
        return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


class FakeTransaction:
    """kazoo's `TransactionRequest`: operations collected, committed as one multi-operation."""

    def __init__(self, zk: FakeZooKeeper) -> None:
        self.zk = zk
        self.ops: list[tuple[Any, ...]] = []

    def create(self, path: str, value: bytes = b"", ephemeral: bool = False, **_: Any) -> None:
        self.ops.append(("create", path, value, ephemeral, False))

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self.ops.append(("set", path, value, version))

    def check(self, path: str, version: int) -> None:
        self.ops.append(("check", path, version))

    def delete(self, path: str, version: int = -1) -> None:
        self.ops.append(("delete", path, version))

    def commit_async(self) -> Answer:
        return Answer(lambda: self.zk._apply(self.ops, multi=True))
