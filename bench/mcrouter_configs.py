"""How much of mcrouter's config language the router takes, measured on mcrouter's own files (not a test).

    .venv/bin/python bench/mcrouter_configs.py MCROUTER_CHECKOUT

MCROUTER_CHECKOUT is a directory holding mcrouter's source tree (its files are read there, never kept in
this repository). Reported, with `router/target/release/squeal-router-config`:

* **preprocessor cases**: each case of `mcrouter/lib/config/test/config_preprocessor_test_file.json` is
  expanded (`--expand`, with the test's two global params and its two import files) and compared with
  the expected output; the cases that differ are listed.
* **preprocessor errors**: each case of `config_preprocessor_test_errors.json` must be refused (exit 1).
* **test configs**: every `mcrouter/test/**/*.json` with a `route`/`routes` is loaded (preprocessor +
  every route built, no connections); `%PORT%`-style params its harness substitutes are given as
  `--config-params`. Counted as clean / with warnings / refused, with the most common refusals.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "router/target/release/squeal-router-config"
TEST_PARAMS = "testGlobal:test,templGlobal:templ"  # the preprocessor test's globals
PORT_PARAMS = "PORT:11211,PORT_1:11212,PORT_2:11213"


def run(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHECK, *args], capture_output=True, text=True, timeout=30)


def loose_json(text: str) -> dict:
    """The test files have // comments and trailing commas."""
    text = re.sub(r"^\s*//.*$", "", text, flags=re.M)
    return json.loads(re.sub(r",(\s*[\]}])", r"\1", text))


def preprocessor_cases(tests: Path) -> tuple[int, list[str]]:
    data = loose_json((tests / "config_preprocessor_test_file.json").read_text())
    same, differ = 0, []
    with tempfile.TemporaryDirectory() as d:
        # the test's import resolver: "test" and "templ" resolve to these texts
        Path(d, "test").write_text('"mock_test"')
        Path(d, "templ").write_text('{"type": "macroDef", "result": "imported_macro"}')
        for group, g in data.items():
            for name, case in g["cases"].items():
                config = Path(d, "case.json")
                config.write_text(
                    json.dumps({"consts": g.get("consts", {}), "macros": g.get("macros", {}), "orig": case["orig"]})
                )
                out = run("--expand", "--config-params", TEST_PARAMS, config)
                got = json.loads(out.stdout)["orig"] if out.returncode == 0 else None
                want = json.dumps(case["expand"], sort_keys=True)
                if out.returncode == 0 and json.dumps(got, sort_keys=True) == want:
                    same += 1
                else:
                    differ.append(f"{group}.{name}: {out.stderr.strip()[-120:] or json.dumps(got)[:120]}")
    return same, differ


def preprocessor_errors(tests: Path) -> tuple[int, list[str]]:
    data = loose_json((tests / "config_preprocessor_test_errors.json").read_text())
    refused, accepted = 0, []
    with tempfile.TemporaryDirectory() as d:
        for name, case in data.items():
            config = Path(d, "case.json")
            config.write_text(json.dumps(case))
            out = run("--expand", "--config-params", TEST_PARAMS, config)
            if out.returncode == 1 and "panicked" not in out.stderr:
                refused += 1
            else:
                accepted.append(name)
    return refused, accepted


def test_configs(checkout: Path) -> tuple[collections.Counter, collections.Counter]:
    counts: collections.Counter = collections.Counter()
    reasons: collections.Counter = collections.Counter()
    for path in sorted((checkout / "mcrouter/test").rglob("*.json")):
        text = path.read_text(errors="replace")
        if '"route"' not in text and '"routes"' not in text:
            continue
        out = run("--config-params", PORT_PARAMS, path)
        if out.returncode != 0:
            counts["refused"] += 1
            reason = out.stderr.strip().splitlines()[-1].split(": ", 2)[-1] if out.stderr.strip() else "?"
            reasons[re.sub(r"`[^`]*`|\"[^\"]*\"", "…", reason)[:90]] += 1
        elif "warning" in out.stderr:
            counts["loads with warnings"] += 1
        else:
            counts["loads clean"] += 1
    return counts, reasons


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkout", type=Path, help="a directory with mcrouter's source tree")
    args = ap.parse_args()
    if not CHECK.exists():
        sys.exit(f"{CHECK} not built: cargo build --release in router/")
    tests = args.checkout / "mcrouter/lib/config/test"
    same, differ = preprocessor_cases(tests)
    print(f"preprocessor cases: {same} of {same + len(differ)} give mcrouter's result")
    for d in differ:
        print(f"  differs: {d}")
    refused, accepted = preprocessor_errors(tests)
    print(f"preprocessor errors: {refused} of {refused + len(accepted)} refused; accepted: {accepted}")
    counts, reasons = test_configs(args.checkout)
    total = sum(counts.values())
    loads = counts["loads clean"] + counts["loads with warnings"]
    print(
        f"test configs: {loads} of {total} load ({counts['loads clean']} clean, "
        f"{counts['loads with warnings']} with warnings), {counts['refused']} refused"
    )
    for reason, n in reasons.most_common(12):
        print(f"  {n:3d}  {reason}")


if __name__ == "__main__":
    main()
