"""scripts/rust_module_cycles.py, the import-circle check `make lint` runs on the Rust crates: on scratch crates
with circles planted in them, and the ratchet that holds the router's old circle while it is taken apart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "rust_module_cycles.py"


def crate(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return src


def check(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


ONE_WAY = {
    "lib.rs": "//! front door\npub mod protocol;\npub mod routes;\npub mod config;\npub use config::load;\n",
    "protocol/mod.rs": "pub mod request;\npub use request::Request;\n",
    "protocol/request.rs": "pub struct Request;\n",
    "routes/mod.rs": "use crate::protocol::Request;\npub fn route(_: Request) {}\n",
    "config.rs": "use crate::routes;\npub fn load() { routes::route(crate::protocol::Request) }\n",
}


def test_a_crate_whose_imports_go_one_way_passes(tmp_path):
    result = check(crate(tmp_path, ONE_WAY))
    assert result.returncode == 0, result.stdout
    assert "no import circle" in result.stdout


def test_a_planted_circle_fails_naming_its_files_and_a_path_round_it(tmp_path):
    files = dict(ONE_WAY)
    # request.rs now reaches back up into config: request -> config -> routes -> protocol (its re-export) -> request
    files["protocol/request.rs"] = "pub struct Request;\npub fn limit() -> usize { crate::config::MAX }\n"
    files["config.rs"] = ONE_WAY["config.rs"] + "pub const MAX: usize = 1;\n"
    result = check(crate(tmp_path, files))
    assert result.returncode == 1, result.stdout
    circle = "config.rs, protocol/mod.rs, protocol/request.rs, routes/mod.rs"
    assert f"an import circle of 4 files: {circle}" in result.stdout
    assert "protocol/request.rs -> config.rs" in result.stdout or "config.rs -> routes/mod.rs" in result.stdout


def test_state_in_lib_rs_imported_back_is_a_circle(tmp_path):
    files = dict(ONE_WAY)
    files["lib.rs"] = ONE_WAY["lib.rs"] + "pub struct Context;\n"
    files["routes/mod.rs"] = "use crate::protocol::Request;\nuse crate::Context;\npub fn route(_: Request) {}\n"
    result = check(crate(tmp_path, files))
    assert result.returncode == 1 and "lib.rs" in result.stdout and "routes/mod.rs" in result.stdout, result.stdout


def test_the_ratchet_holds_an_old_circle_and_refuses_a_new_member_or_a_stale_entry(tmp_path):
    files = dict(ONE_WAY)
    files["protocol/request.rs"] = "pub struct Request;\npub fn limit() -> usize { crate::config::MAX }\n"
    files["config.rs"] = ONE_WAY["config.rs"] + "pub const MAX: usize = 1;\n"
    src = crate(tmp_path, files)
    known = tmp_path / "known.txt"
    known.write_text("# the old circle\nconfig.rs\nprotocol/mod.rs\nprotocol/request.rs\nroutes/mod.rs\n")
    assert check(src, "--known", known).returncode == 0
    # a new file joins the circle: refused, named
    (src / "routes" / "mod.rs").write_text(
        "use crate::protocol::Request;\npub mod pool;\npub fn route(_: Request) { pool::send() }\n"
    )
    (src / "routes" / "pool.rs").write_text("pub fn send() { let _ = crate::config::MAX; }\n")
    result = check(src, "--known", known)
    assert result.returncode == 1 and "not in" in result.stdout and "routes/pool.rs" in result.stdout, result.stdout
    # the circle taken apart: the list must shrink with it
    (src / "protocol" / "request.rs").write_text("pub struct Request;\n")
    (src / "routes" / "pool.rs").write_text("pub fn send() {}\n")
    result = check(src, "--known", known)
    assert result.returncode == 1 and "config.rs is in no circle any more" in result.stdout, result.stdout


def test_neither_crate_has_an_import_circle():
    # the router's old circle (issue 36) is gone, and with it its ratchet list
    router = check(ROOT / "router" / "src")
    assert router.returncode == 0, router.stdout
    native = check(ROOT / "squeal_native" / "src")
    assert native.returncode == 0, native.stdout
