"""Reading cached values through a router without side effects: `mg <key> v f [c]` without `N`.

A classic `get` through a pool with leases (the router's TransparentLeaseRoute) turns a miss into a won lease: an
empty placeholder item that makes the next web reader wait for a fill the checker never makes. Every reader here
(`verify`, the sampled-delete re-checks, the consistency inspector) asks with meta commands that take no lease
and pass such a pool unchanged. A lease placeholder reads as a 0-byte value.

A value marked stale (`X`: a pool with `stale_ttl`, where a delete keeps the value for a while) reads as absent:
it has been invalidated, and readers get it only while one of them refills it. memcached gives the first `mg` of a
stale item the refill (`W`) whatever flags it asks with; a reader here that got it gives it back at once by
marking the item stale again with the TTL it had left (`md KEY I T<ttl> q`), so the next web reader refills.
"""

from __future__ import annotations

import socket
import ssl

import router_config


def plain_key(key: str) -> bool:
    """A key a text-protocol command can name as it is: 1-250 bytes, no spaces or control bytes (squeal sends
    others base64 or hashed; memcached refuses them as they are)."""
    raw = key.encode()
    return 0 < len(raw) <= 250 and not any(b <= 0x20 or b == 0x7F for b in raw)


class MetaReader:
    """One connection to one router; `gets_many` pipelines one `mg` per key and ends the batch with `mn`. Every
    failure is an OSError (the router closed, timed out, or answered something that is not meta)."""

    def __init__(self, address: router_config.Address, tls: ssl.SSLContext | None, timeout: float = 5.0) -> None:
        self.address = address
        sock = socket.create_connection((address.host, address.port), timeout=timeout)
        self.sock = tls.wrap_socket(sock, server_hostname=address.host) if tls is not None else sock
        self.buffer = b""

    def gets_many(self, keys: list[str]) -> dict[str, tuple[tuple[bytes, int], bytes]]:
        """{key: ((value, client flags), cas token)} of the keys cached (keys without spaces or control bytes); a
        value marked stale counts as not cached (see the module's docstring)."""
        self.sock.sendall(b"".join(b"mg " + k.encode() + b" v f c t\r\n" for k in keys) + b"mn\r\n")
        out: dict[str, tuple[tuple[bytes, int], bytes]] = {}
        give_back: list[bytes] = []
        for key in keys:
            line = self._line()
            if line.startswith(b"VA "):
                words = line.split()
                flags = next((int(w[1:]) for w in words[2:] if w.startswith(b"f")), 0)
                cas = next((w[1:] for w in words[2:] if w.startswith(b"c")), b"")
                value = self._exactly(int(words[1]) + 2)[:-2]
                if b"X" not in words[2:]:
                    out[key] = ((value, flags), cas)
                elif b"W" in words[2:]:
                    ttl = next((w[1:] for w in words[2:] if w.startswith(b"t")), b"-1")
                    give_back.append(b"md " + key.encode() + b" I" + (b" T" + ttl if ttl != b"-1" else b"") + b" q\r\n")
            elif line != b"EN":
                raise OSError(f"router {self.address}: unexpected answer to mg {key}: {line[:100]!r}")
        end = self._line()
        if end != b"MN":
            raise OSError(f"router {self.address}: unexpected answer to mn: {end[:100]!r}")
        if give_back:
            self.sock.sendall(b"".join(give_back) + b"mn\r\n")
            end = self._line()
            if end != b"MN":
                raise OSError(f"router {self.address}: unexpected answer to a stale mark: {end[:100]!r}")
        return out

    def get_many(self, keys: list[str]) -> dict[str, tuple[bytes, int]]:
        """{key: (value, client flags)} of the keys cached."""
        return {k: v for k, (v, _) in self.gets_many(keys).items()}

    def raw_command(self, command: bytes, end: bytes = b"\r\n") -> bytes:
        """One command's one-line answer (e.g. `mg KEY t` -> `HD t<seconds>` or `EN`)."""
        self.sock.sendall(command + b"\r\n")
        return self._line()

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise OSError(f"router {self.address} closed the connection")
        self.buffer += chunk

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self._fill()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self._fill()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def close(self) -> None:
        self.sock.close()
