"""Reading cached values through a router without side effects: `mg <key> v f [c]` without `N`.

A classic `get` through a pool with leases (the router's TransparentLeaseRoute) turns a miss into a won lease: an
empty placeholder item that makes the next web reader wait for a fill the checker never makes. Every reader here
(`verify`, the sampled-delete re-checks, the consistency inspector) asks with meta commands that take no lease
and pass such a pool unchanged. A lease placeholder reads as a 0-byte value.
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
        """{key: ((value, client flags), cas token)} of the keys cached (keys without spaces or control bytes)."""
        self.sock.sendall(b"".join(b"mg " + k.encode() + b" v f c\r\n" for k in keys) + b"mn\r\n")
        out: dict[str, tuple[tuple[bytes, int], bytes]] = {}
        for key in keys:
            line = self._line()
            if line.startswith(b"VA "):
                words = line.split()
                flags = next((int(w[1:]) for w in words[2:] if w.startswith(b"f")), 0)
                cas = next((w[1:] for w in words[2:] if w.startswith(b"c")), b"")
                out[key] = ((self._exactly(int(words[1]) + 2)[:-2], flags), cas)
            elif line != b"EN":
                raise OSError(f"router {self.address}: unexpected answer to mg {key}: {line[:100]!r}")
        end = self._line()
        if end != b"MN":
            raise OSError(f"router {self.address}: unexpected answer to mn: {end[:100]!r}")
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
