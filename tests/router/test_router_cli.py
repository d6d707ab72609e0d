"""The router's command line (clap): every flag the harness, ops and the docs use is taken as
before, `--help` explains each flag, and a bad flag or value is named in the error, exit status 2."""

from __future__ import annotations

import subprocess

from tests.router.conftest import ROUTER_BIN, Conn

FLAGS = [
    "--config-file",
    "--port",
    "--listen",
    "--metrics-port",
    "--spool-dir",
    "--spool-max-mb",
    "--server-timeout-ms",
    "--connect-timeout-ms",
    "--probe-delay-initial-ms",
    "--probe-delay-max-ms",
    "--route-prefix",
    "--threads",
    "--enable-flush-cmd",
    "--max-item-size",
    "--auth-file",
    "--upstream-auth-file",
    "--no-config-watch",
    "--help",
]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROUTER_BIN), *args], capture_output=True, text=True, timeout=30)


def test_help_explains_every_flag_in_one_line() -> None:
    done = run("--help")
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stdout.splitlines() if ln.lstrip().startswith("-")]
    for flag in FLAGS:
        line = next((ln for ln in lines if flag in ln.replace(",", " ").split()[:2]), None)
        assert line is not None, f"{flag} not in --help:\n{done.stdout}"
        words = line.split(flag, 1)[1].split()
        assert len(words) >= 2, f"{flag} has no explanation on its line: {line!r}"


def test_a_bad_flag_or_value_is_named_with_status_2(tmp_path) -> None:
    config = tmp_path / "c.json"
    config.write_text('{"route": "NullRoute"}')
    base = ("--config-file", str(config), "-p", "1")
    cases = [
        (("--enable-flush",), "--enable-flush"),  # unknown (a similar one exists)
        (("--port", "x", "--config-file", str(config)), "--port"),
        (("-p", "70000", "--config-file", str(config)), "--port"),
        ((*base, "--threads", "two"), "--threads"),
        ((*base, "--max-item-size", "1x"), "--max-item-size"),
        ((*base, "--server-timeout-ms", "0"), "--server-timeout-ms"),
        ((*base, "--enable-flush-cmd=no"), "--enable-flush-cmd"),
        ((*base, "--auth-file", str(tmp_path / "missing")), "--auth-file"),
        (("-p", "1"), "--config-file"),  # required
    ]
    for args, flag in cases:
        done = run(*args)
        assert done.returncode == 2, (args, done.returncode, done.stderr)
        assert done.stderr.startswith("error: "), (args, done.stderr)
        assert flag in done.stderr, (args, done.stderr)


def test_every_flag_the_harness_and_docs_use_still_starts_the_router(tmp_path, memcached_factory, router_factory):
    mc = memcached_factory()
    auth = tmp_path / "auth"
    auth.write_text("alice:secret\n")
    config = {"pools": {"p": {"servers": [mc.address]}}, "route": "PoolRoute|p"}
    router = router_factory(
        config,
        extra_args=(
            "--spool-max-mb=8",
            "--server-timeout-ms",
            "500",
            "--connect-timeout-ms",
            "500",
            "--probe-delay-initial-ms",
            "300",
            "--probe-delay-max-ms",
            "1000",
            "--threads",
            "2",
            "--enable-flush-cmd",
            "--max-item-size",
            "2m",
            "--upstream-auth-file",
            str(auth),  # memcached without -Y answers the login `set` STORED
            "-R",
            "/x/y/",
        ),
    )
    c = Conn(router.address)
    assert c.call(b"set k 0 0 1\r\nv\r\n") == b"STORED"
    assert c.call(b"flush_all\r\n") == b"OK"
