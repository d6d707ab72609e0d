"""A `Unit` as a systemd unit file: ExecStart= quoting, restarts, resource limits and the sandbox every
service runs in (what it may write, ProtectHome= when it needs a home directory, the system-call allow-list),
and the target that groups a host's units."""

from __future__ import annotations

import re
from pathlib import Path

from ops.harness import REPO_ROOT
from ops.systemd.host import _HOME_ROOTS, _SYSTEMD_STATE_ROOT, DEFAULT_VENV, HEADER, TARGET, RenderOptions, Unit

_PLAIN = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def exec_quote(arg: str) -> str:
    """One ExecStart= word: `%` and `$` escaped (systemd expands both), quoted when it holds anything else."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN.match(arg):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _path_setting(path: Path) -> str:
    """A path as the value of WorkingDirectory= / ReadWritePaths= (checked free of whitespace by render)."""
    return str(path).replace("%", "%%")


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def home_paths(opts: RenderOptions, config_dir: Path) -> list[Path]:
    """What the services need that lives in a home directory (then ProtectHome= can only be read-only).

    Symlinks are followed: a venv's bin/python often points at an interpreter in someone's home (pyenv),
    and this repository's venv imports its code from the repository (an editable install)."""
    venv = opts.venv
    paths = [venv / "bin" / "python", opts.router_bin, opts.memcached_bin, config_dir, opts.data_dir]
    if venv.absolute() == DEFAULT_VENV:
        paths.append(REPO_ROOT)
    real = {p.resolve() if p.exists() else p for p in paths}
    return sorted(p for p in real if any(_under(p, root) for root in _HOME_ROOTS))


def unit_text(unit: Unit, opts: RenderOptions, config_dir: Path) -> str:
    in_home = bool(home_paths(opts, config_dir))
    lines = [
        HEADER,
        "[Unit]",
        f"Description={unit.description.replace('%', '%%')}",
        f"PartOf={TARGET}",
        "StartLimitIntervalSec=60",
        "StartLimitBurst=10",
    ]
    if unit.needs_network:
        lines += ["Wants=network-online.target", "After=network-online.target"]
    lines += [f"After={name}" for name in unit.after]
    lines += [
        "",
        "[Service]",
        "Type=exec",
        f"User={opts.user}",
        *(f"ExecStartPre={' '.join(exec_quote(a) for a in pre)}" for pre in unit.pre),
        f"ExecStart={' '.join(exec_quote(a) for a in unit.argv)}",
        f"WorkingDirectory={_path_setting(config_dir)}",
    ]
    lines += [f"Environment={k}={v}" for k, v in unit.environment]
    lines += [
        "Restart=on-failure",
        "RestartSec=2s",
        "TimeoutStopSec=30s",  # squeal flushes queued deletes and writes its datamarkers on SIGTERM
        "",
        "# resource limits",
        f"LimitNOFILE={unit.limit_nofile}",
    ]
    if unit.memory_max_mb is not None:
        lines.append(f"MemoryMax={unit.memory_max_mb}M")
    lines += ["", "# state it writes (everything else is read-only)"]
    for sub in unit.state:
        path = opts.data_dir / sub
        if _under(path, _SYSTEMD_STATE_ROOT) and path != _SYSTEMD_STATE_ROOT:
            lines += [f"StateDirectory={path.relative_to(_SYSTEMD_STATE_ROOT)}", "StateDirectoryMode=0750"]
        else:
            lines.append(f"ReadWritePaths={_path_setting(path)}")
    low_ports = any(p < 1024 for p in unit.ports)
    lines += [
        "",
        "# hardening",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        f"ProtectHome={'read-only' if in_home else 'yes'}",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "ProtectProc=invisible",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "RemoveIPC=yes",
        "UMask=0027",
        "SystemCallArchitectures=native",
        "SystemCallFilter=@system-service",
        "SystemCallErrorNumber=EPERM",
        f"CapabilityBoundingSet={'CAP_NET_BIND_SERVICE' if low_ports else ''}",
    ]
    if low_ports:
        lines.append("AmbientCapabilities=CAP_NET_BIND_SERVICE")
    if unit.jit_free:
        lines.append("MemoryDenyWriteExecute=yes")
    lines += ["", "[Install]", f"WantedBy={TARGET}", ""]
    return "\n".join(lines)


def target_text(host: str, units: list[Unit]) -> str:
    lines = [
        HEADER,
        "[Unit]",
        f"Description=squeal: every component of host {host}",
    ]
    lines += [f"Wants={u.name}" for u in units]
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)
