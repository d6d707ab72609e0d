"""The settings sections of a topology file: `[tls]`, `[zookeeper]`, `[squeal]`, `[monitoring]` and the
`[[rules]]` (their key templates checked against their columns)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from router_config import predicate
from router_config.loading.base import Reader
from router_config.model import (
    COLUMN_NAME,
    DEFAULT_HOST,
    DELIVERIES,
    ON_DATA_LOSS,
    ON_TRUNCATE,
    PLACEHOLDER,
    READERS,
    TLS_COMPONENTS,
    Address,
    CertKey,
    ConsistencySlo,
    MonitoringSettings,
    Rule,
    SquealSettings,
    TlsSettings,
    ZooKeeperSettings,
)

CODEC_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")  # a rule's `codec` (monitoring/verify.py)
# `[monitoring] consistency_slo`: "6 nines within 1s", "4.5 nines within 100ms", "3 nines within 1m"
SLO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s+nines?\s+within\s+(\d+(?:\.\d+)?)\s*(ms|s|m)\s*$")
ZNODE_PATH = re.compile(r"^(/[A-Za-z0-9_.-]+)+$")


class SettingsSections(Reader):
    """The settings sections and the rules."""

    def base_dir(self) -> Path:
        """Relative paths in the topology are relative to the file's directory (a `loads` string: the cwd)."""
        source = Path(self.source)
        return source.resolve().parent if source.is_file() else Path.cwd()

    def pem_file(self, value: Any, path: str) -> str:
        self.typed(value, path, str, "a path to a PEM file")
        if not value:
            raise self.fail(path, "must not be empty")
        full = self.base_dir() / value
        if not full.is_file():
            raise self.fail(path, f"{value!r}: no such file ({full})")
        return str(full)

    def tls(self, value: Any, path: str) -> TlsSettings:
        """`[tls]`: `ca`, `require`, `dir` (the convention `<dir>/ca.crt`, `<dir>/<component>.crt` + `.key`, as
        `ops.tls` writes them) and `[tls.<component>]` tables of `cert` + `key` that override the convention."""
        self.table(value, path, {"ca", "require", "dir", *TLS_COMPONENTS})
        require = self.typed(value.get("require", False), f"{path}.require", bool, "true or false")
        directory: Path | None = None
        if "dir" in value:
            self.typed(value["dir"], f"{path}.dir", str, "a directory path")
            directory = self.base_dir() / value["dir"]
            if not directory.is_dir():
                raise self.fail(f"{path}.dir", f"{value['dir']!r}: no such directory ({directory})")
        ca: str | None = None
        if "ca" in value:
            ca = self.pem_file(value["ca"], f"{path}.ca")
        elif directory is not None and (directory / "ca.crt").is_file():
            ca = str(directory / "ca.crt")
        if require and ca is None:
            where = f" (and {path}.dir has no ca.crt)" if directory is not None else ""
            raise self.fail(
                f"{path}.require",
                f"require = true needs {path}.ca, the CA that every peer's certificate is checked against{where}",
            )
        certs: list[tuple[str, CertKey]] = []
        for component in TLS_COMPONENTS:
            at = f"{path}.{component}"
            if component in value:
                body = self.table(value[component], at, {"cert", "key"}, {"cert", "key"})
                certs.append(
                    (
                        component,
                        CertKey(self.pem_file(body["cert"], f"{at}.cert"), self.pem_file(body["key"], f"{at}.key")),
                    )
                )
            elif directory is not None:
                cert, key = directory / f"{component}.crt", directory / f"{component}.key"
                if cert.is_file() != key.is_file():
                    have, missing = (cert, key) if cert.is_file() else (key, cert)
                    raise self.fail(f"{path}.dir", f"{have.name} without {missing.name} in {directory}")
                if cert.is_file():
                    certs.append((component, CertKey(str(cert), str(key))))
        if ca is None and not certs:
            raise self.fail(path, "names no CA and no certificate: set ca (and [tls.<component>] cert/key, or dir)")
        return TlsSettings(ca=ca, require=require, certs=tuple(certs))

    def zookeeper(self, value: Any, path: str) -> ZooKeeperSettings:
        self.table(
            value,
            path,
            {"servers", "session_timeout_s", "root", "takeover_wait_s", "handback_after_s", "peer_ports", "digest"},
            {"servers"},
        )
        digest = value.get("digest")
        if digest is not None:
            self.typed(digest, f"{path}.digest", str, 'a "user:password" string')
            user, sep, password = digest.partition(":")
            if not sep or not user or not password:
                raise self.fail(f"{path}.digest", 'must be "user:password" (both non-empty)')
        servers = self.addresses(value["servers"], f"{path}.servers")
        peer_ports = self.peer_ports(value.get("peer_ports"), servers, f"{path}.peer_ports")
        numbers = {}
        for name in ("session_timeout_s", "takeover_wait_s", "handback_after_s"):
            v = self.typed(
                value.get(name, getattr(ZooKeeperSettings, name)), f"{path}.{name}", (int, float), "a number of seconds"
            )
            if v <= 0:
                raise self.fail(f"{path}.{name}", f"must be greater than 0, got {v}")
            numbers[name] = float(v)
        root = self.typed(value.get("root", ZooKeeperSettings.root), f"{path}.root", str, "a znode path")
        if not ZNODE_PATH.match(root):
            raise self.fail(f"{path}.root", f'{root!r} is not a znode path like "/squeal"')
        return ZooKeeperSettings(servers=servers, root=root, peer_ports=peer_ports, digest=digest, **numbers)

    def peer_ports(self, value: Any, servers: tuple[Address, ...], path: str) -> tuple[tuple[int, int], ...]:
        """`peer_ports = [[quorum, election], ...]`, one pair per server (default: its client port + 100, + 200).
        Claimed like every listening port, so a clash is an error naming the key."""
        if value is None:
            pairs = [(a.port + 100, a.port + 200) for a in servers]
            where = [f"{path} (default for servers[{i}]: its port + 100, + 200)" for i in range(len(servers))]
        else:
            self.typed(value, path, list, "a list of [quorum, election] port pairs, one per server")
            if len(value) != len(servers):
                raise self.fail(
                    path,
                    f"{len(value)} pairs for {len(servers)} servers: one [quorum, election] "
                    "pair per server, in the order of servers",
                )
            pairs, where = [], []
            for i, pair in enumerate(value):
                self.typed(pair, f"{path}[{i}]", list, "a [quorum, election] port pair")
                if len(pair) != 2:
                    raise self.fail(f"{path}[{i}]", f"{pair!r} is not a [quorum, election] port pair")
                pairs.append((self.port(pair[0], f"{path}[{i}][0]"), self.port(pair[1], f"{path}[{i}][1]")))
                where.append(f"{path}[{i}]")
        for a, (quorum, election), at in zip(servers, pairs, where, strict=True):
            for port in (quorum, election):
                if not 1 <= port <= 65535:
                    raise self.fail(at, f"port {port} is out of range 1-65535")
                self.claim(a.host, port, at)
        return tuple(pairs) if value is not None else ()

    def settings(self, value: Any, path: str) -> SquealSettings:
        names = {f.name for f in fields(SquealSettings)}
        self.table(value, path, names)
        defaults = SquealSettings()
        kinds: dict[str, tuple[type | tuple[type, ...], str]] = {
            "batch_size": (int, "a positive integer"),
            "flush_interval_ms": ((int, float), "a number of milliseconds"),
            "max_backlog": (int, "a positive integer"),
            "datamarker_dir": (str, "a directory path"),
            "metrics_port_base": (int, "a port number"),
            "marker_max_age_s": ((int, float), "a number of seconds"),
            "max_lag_s": ((int, float), "a number of seconds"),
            "on_data_loss": (str, " or ".join(f'"{c}"' for c in ON_DATA_LOSS)),
            "reader": (str, " or ".join(f'"{c}"' for c in READERS)),
            "delivery": (str, " or ".join(f'"{c}"' for c in DELIVERIES)),
        }
        out: dict[str, Any] = {}
        for name in names:
            v = value.get(name, getattr(defaults, name))
            kind, what = kinds[name]
            self.typed(v, f"{path}.{name}", kind, what)
            if isinstance(v, int | float) and not isinstance(v, bool) and v <= 0:
                raise self.fail(f"{path}.{name}", f"must be greater than 0, got {v}")
            floats = ("flush_interval_ms", "marker_max_age_s", "max_lag_s")
            out[name] = float(v) if name in floats else v
        if out["on_data_loss"] not in ON_DATA_LOSS:
            choices = " or ".join(f'"{c}"' for c in ON_DATA_LOSS)
            raise self.fail(f"{path}.on_data_loss", f"must be {choices}, got {out['on_data_loss']!r}")
        if out["reader"] not in READERS:
            choices = " or ".join(f'"{c}"' for c in READERS)
            raise self.fail(f"{path}.reader", f"must be {choices}, got {out['reader']!r}")
        if out["delivery"] not in DELIVERIES:
            choices = " or ".join(f'"{c}"' for c in DELIVERIES)
            raise self.fail(f"{path}.delivery", f"must be {choices}, got {out['delivery']!r}")
        return SquealSettings(**out)

    def monitoring(self, value: Any, path: str) -> MonitoringSettings:
        self.table(
            value,
            path,
            {"port", "probe_interval", "host", "consistency_sample", "consistency_check_after", "consistency_slo"},
        )
        host = self.host(value.get("host", DEFAULT_HOST), f"{path}.host")
        port = self.port(value.get("port", MonitoringSettings.port), f"{path}.port")
        self.claim(host, port, f"{path}.port")
        defaults = MonitoringSettings()
        interval = self.positive_seconds(value, path, "probe_interval", defaults.probe_interval)
        sample = self.typed(
            value.get("consistency_sample", defaults.consistency_sample), f"{path}.consistency_sample", int, "1 in N"
        )
        if sample < 1:
            raise self.fail(f"{path}.consistency_sample", f"must be 1 or more (1 = every row change), got {sample}")
        after = self.positive_seconds(value, path, "consistency_check_after", defaults.consistency_check_after)
        slo = None
        if "consistency_slo" in value:
            slo = self.consistency_slo(value["consistency_slo"], f"{path}.consistency_slo")
        return MonitoringSettings(
            port=port,
            probe_interval=float(interval),
            host=host,
            consistency_sample=sample,
            consistency_check_after=float(after),
            consistency_slo=slo,
        )

    def positive_seconds(self, value: Any, path: str, key: str, default: float) -> int | float:
        """`key` of the table `value` at `path` (`default` when absent): a number of seconds, more than 0."""
        seconds = self.typed(value.get(key, default), f"{path}.{key}", (int, float), "seconds")
        if seconds <= 0:
            raise self.fail(f"{path}.{key}", f"must be greater than 0 seconds, got {seconds}")
        return seconds

    def consistency_slo(self, value: Any, path: str) -> ConsistencySlo:
        text = self.typed(value, path, str, 'a string like "6 nines within 1s"')
        m = SLO.match(text)
        if m is None:
            raise self.fail(path, f'{text!r} does not read like "6 nines within 1s" (or "4.5 nines within 100ms")')
        nines, amount, unit = float(m.group(1)), float(m.group(2)), m.group(3)
        within = amount / 1000 if unit == "ms" else amount * 60 if unit == "m" else amount
        if nines <= 0 or within <= 0:
            raise self.fail(path, f"{text!r}: the nines and the window must be greater than 0")
        return ConsistencySlo(nines, within)

    def rules(self, value: Any, path: str) -> tuple[Rule, ...]:
        self.typed(value, path, list, "an array of [[rules]] tables")
        rules: list[Rule] = []
        seen: set[str] = set()
        for i, body in enumerate(value):
            here = f"{path}[{i}]"
            self.table(
                body,
                here,
                {"table", "keys", "on_truncate", "codec", "when_changed", "where", "shards"},
                {"table", "keys"},
            )
            table = self.typed(body["table"], f"{here}.table", str, 'a "schema.table" name')
            parts = table.split(".")
            if len(parts) != 2 or not all(COLUMN_NAME.match(p) for p in parts):
                raise self.fail(f"{here}.table", f'{table!r} is not a "schema.table" name')
            if table in seen:
                raise self.fail(f"{here}.table", f"duplicate rule for table {table!r}")
            seen.add(table)
            keys = self.string_list(body["keys"], f"{here}.keys")
            for k, template in enumerate(keys):
                self.template(template, f"{here}.keys[{k}]")
            on_truncate = self.typed(body.get("on_truncate", "alert"), f"{here}.on_truncate", str, '"alert" or "flush"')
            if on_truncate not in ON_TRUNCATE:
                raise self.fail(f"{here}.on_truncate", f'must be "alert" or "flush", got {on_truncate!r}')
            codec = body.get("codec")
            if codec is not None and not CODEC_PATH.match(self.typed(codec, f"{here}.codec", str, "an import path")):
                raise self.fail(f"{here}.codec", f'{codec!r} is not an import path like "package.module:function"')
            when_changed: tuple[str, ...] = ()
            if "when_changed" in body:
                when_changed = self.string_list(body["when_changed"], f"{here}.when_changed")
                for k, name in enumerate(when_changed):
                    if not COLUMN_NAME.match(name):
                        raise self.fail(f"{here}.when_changed[{k}]", f"{name!r} is not a column name like user_id")
            where = None
            if "where" in body:
                text = self.typed(body["where"], f"{here}.where", str, "a predicate like \"status != 'draft'\"")
                try:
                    where = predicate.parse(text)
                except predicate.PredicateError as e:
                    raise self.fail(f"{here}.where", f"{e} (at character {e.offset + 1} of {text!r})") from None
            rules.append(
                Rule(
                    table=table, keys=keys, on_truncate=on_truncate, codec=codec, when_changed=when_changed, where=where
                )
            )
        return tuple(rules)

    def template(self, template: str, path: str) -> None:
        if template.count("{") != template.count("}"):
            raise self.fail(path, f"unbalanced braces in key template {template!r}")
        names = PLACEHOLDER.findall(template)
        if not names:
            raise self.fail(path, f"key template {template!r} names no {{column}}: every row would share one key")
        for name in names:
            if not COLUMN_NAME.match(name):
                raise self.fail(path, f"{{{name}}} in {template!r} is not a column name like {{user_id}}")
        if any(c.isspace() for c in PLACEHOLDER.sub("", template)):
            raise self.fail(path, f"key template {template!r} contains whitespace; memcache keys cannot")
