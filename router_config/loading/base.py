"""The readers every section of a topology file is read with (router_config/loader.py): a value's type and
keys, addresses and the port each claims, all failing with `TopologyError` naming the key path."""

from __future__ import annotations

import re
from collections.abc import Set
from typing import Any

from router_config.model import Address, TlsSettings

# Names of database copies and squeal instances: they become znode and file names.
COPY_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class TopologyError(ValueError):
    """A topology file is invalid. `str()` is `file: key.path: what is wrong`."""

    def __init__(self, source: str, path: str, message: str) -> None:
        self.source, self.path, self.message = source, path, message
        where = f"{source}: {path}: " if path else f"{source}: "
        super().__init__(where + message)


class Reader:
    """The state every section reads with: the file (named in errors), which key path claimed each port, and
    `[tls]` (read first: every Database carries it); and the readers of TOML values every section shares."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.ports: dict[tuple[str, int], str] = {}  # (host, port) -> key path that claimed it
        self.tls_settings: TlsSettings | None = None  # [tls], read first: every Database carries it

    def fail(self, path: str, message: str) -> TopologyError:
        return TopologyError(self.source, path, message)

    def table(self, value: Any, path: str, allowed: set[str], required: Set[str] = frozenset()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a table, got {type(value).__name__}")
        for key in value:
            if key not in allowed:
                raise self.fail(f"{path}.{key}", f"unknown key (expected one of: {', '.join(sorted(allowed))})")
        for key in sorted(required):
            if key not in value:
                raise self.fail(path, f"missing required key {key!r}")
        return value

    def typed(self, value: Any, path: str, kind: type | tuple[type, ...], what: str) -> Any:
        if isinstance(value, bool) and kind is not bool:
            raise self.fail(path, f"must be {what}, got a boolean")
        if not isinstance(value, kind):
            raise self.fail(path, f"must be {what}, got {type(value).__name__} {value!r}")
        return value

    def string_list(self, value: Any, path: str, *, non_empty: bool = True) -> tuple[str, ...]:
        self.typed(value, path, list, "a list of strings")
        if non_empty and not value:
            raise self.fail(path, "must not be empty")
        for i, item in enumerate(value):
            self.typed(item, f"{path}[{i}]", str, "a string")
        return tuple(value)

    def port(self, value: Any, path: str) -> int:
        self.typed(value, path, int, "a port number")
        if not 1 <= value <= 65535:
            raise self.fail(path, f"port {value} is out of range 1-65535")
        return value

    def host(self, value: Any, path: str) -> str:
        """A host name or IP address where a component runs (no port)."""
        self.typed(value, path, str, "a host name or IP address")
        if not value or any(c.isspace() for c in value):
            raise self.fail(path, f"{value!r} is not a host name or IP address")
        return value

    def claim(self, host: str, port: int, path: str) -> None:
        """Every listening socket in the topology must be distinct."""
        previous = self.ports.get((host, port))
        if previous is not None:
            raise self.fail(path, f"duplicate port: {host}:{port} is already used by {previous}")
        self.ports[(host, port)] = path

    def address(self, value: Any, path: str) -> Address:
        self.typed(value, path, str, 'a "host:port" string')
        host, sep, port_text = value.rpartition(":")
        if not sep or not host or not port_text.isdigit():
            raise self.fail(path, f'{value!r} is not a "host:port" address')
        port = self.port(int(port_text), path)
        self.claim(host, port, path)
        return Address(host, port)

    def addresses(self, value: Any, path: str) -> tuple[Address, ...]:
        items = self.string_list(value, path)
        return tuple(self.address(v, f"{path}[{i}]") for i, v in enumerate(items))
