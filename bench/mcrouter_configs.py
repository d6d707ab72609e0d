"""How much of mcrouter's config language the router takes, measured on mcrouter's own files (not a test).

    .venv/bin/python bench/mcrouter_configs.py MCROUTER_CHECKOUT [--list]

MCROUTER_CHECKOUT is a directory holding mcrouter's source tree (its files are read there, never kept in
this repository). Reported, with `router/target/release/squeal-router-config`:

* **preprocessor cases**: each case of `mcrouter/lib/config/test/config_preprocessor_test_file.json` is
  expanded (`--expand`, with the test's two global params and its two import files) and compared with
  the expected output; the cases that differ are listed.
* **preprocessor errors**: each case of `config_preprocessor_test_errors.json` must be refused (exit 1).
* **test configs**, counted as docs/router.md ("mcrouter's test configs") explains:
  - every `*.json` under `mcrouter/` with a `route`/`routes` (its Python tests' configs), loaded as its
    test harness loads it: the `--config-params` its tests pass (`%PORT%`, `%POOL%`, …) and the
    `START_TIME` text its harness replaces;
  - every JSON object written as a raw string (`R"(…)"`) in mcrouter's C++ route tests
    (`mcrouter/routes/test/*.cpp`, `mcrouter/test/cpp_unit_tests/*.cpp`) that configures a route: a
    whole config (loaded as it is), a handle object with `type` (loaded as the `route`), or the fields
    of the handle the test file is named after (`DistributionRouteTest.cpp` → DistributionRoute;
    where the test hands the handle its child in code, `NullRoute` stands in for that child).
    Objects that configure something else (shadow settings, bare pool lists) are not route configs.
  Each is counted as loads (clean / with warnings) or refused; a refusal is split into those mcrouter
  refuses too (its test expects an exception, or the file is named `*invalid*`), those refused only for
  `protocol: caret`/`thrift` pools (out of scope here; checked by loading them again with the protocol
  removed), and the rest, with the most common reasons.
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
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "router/target/release/squeal-router-config"
TEST_PARAMS = "testGlobal:test,templGlobal:templ"  # the preprocessor test's globals
# what mcrouter's Python tests pass as --config-params, and what its harness's replace_map replaces
HARNESS_PARAMS = "PORT:11211,PORT_1:11212,PORT_2:11213,PORT_SHADOW:11214,POOL:A"
HARNESS_TEXT = {"START_TIME": "1700000000"}
# C++ route tests where the test builds the handle around a mock child: the field mcrouter's own
# config form reads that child from (McBucketRoute has none in mcrouter; `target` here)
CHILD_IN_CODE = {"DistributionRoute": "child", "HashStopAllowListRoute": "target", "McBucketRoute": "target"}
CPP_TEST_DIRS = ("mcrouter/routes/test", "mcrouter/test/cpp_unit_tests")
RAW_STRING = re.compile(r'R"([A-Za-z_]*)\((.*?)\)\1"', re.S)
EXPECTS_THROW = re.compile(r"(EXPECT|ASSERT)_(ANY_)?THROW|try\s*\{(?:(?!catch).)*?FAIL\(\)", re.S)


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


class Case(NamedTuple):
    name: str
    text: str
    expect_refused: bool
    path: Path | None = None  # the file itself, when `text` is its text (its @imports are relative to it)


def json_cases(checkout: Path) -> list[Case]:
    cases = []
    for path in sorted((checkout / "mcrouter/test").rglob("*.json")):
        original = path.read_text(errors="replace")
        if '"route"' not in original and '"routes"' not in original:
            continue
        text = original
        for placeholder, value in HARNESS_TEXT.items():
            text = text.replace(placeholder, value)
        name = str(path.relative_to(checkout))
        cases.append(Case(name, text, "invalid" in path.name, path if text == original else None))
    return cases


def fragment_type(path: Path, obj: dict) -> str | None:
    """The handle a C++ test builds from a bare fields object: the one its file is named after."""
    if "match_child" in obj:
        return "ShardFilterRoute"  # ShardSelectionRouteTest.cpp tests this one too
    if path.stem == "ShardSelectionRouteFactoryBenchmark":
        return "EagerShardSelectionRoute" if "children_type" in obj else "ShardSelectionRoute"
    if path.stem.endswith("RouteTest"):
        return path.stem[: -len("Test")]
    return None


def expects_refusal(source: str, start: int, end: int) -> bool:
    """Does the test around this raw string expect the config to be refused?"""
    following = re.split(r"\nTEST(?:_F)?\(", source[end:], maxsplit=1)[0]
    if EXPECTS_THROW.search(following):
        return True
    constant = re.search(r"(k\w+)\s*=\s*$", source[max(0, start - 120) : start])
    if not constant:
        return False
    # a named constant: any statement that expects it to throw
    for use in re.finditer(rf"\b{constant.group(1)}\b", source[end:]):
        at = end + use.start()
        statement = source[max(source.rfind(";", 0, at), source.rfind("{", 0, at)) + 1 : source.find(";", at) + 1]
        if EXPECTS_THROW.search(statement):
            return True
    return False


def cpp_cases(checkout: Path) -> list[Case]:
    cases = []
    for directory in CPP_TEST_DIRS:
        for path in sorted((checkout / directory).glob("*.cpp")):
            source = path.read_text(errors="replace")
            for i, m in enumerate(RAW_STRING.finditer(source)):
                try:
                    obj = loose_json(m.group(2))
                except ValueError:
                    continue  # a format template (`{{`), not JSON
                if not isinstance(obj, dict):
                    continue
                if "route" in obj or "routes" in obj:
                    config = obj
                elif "type" in obj:
                    config = {"route": obj}
                elif ty := fragment_type(path, obj):
                    handle = {"type": ty, **obj}
                    if ty in CHILD_IN_CODE and CHILD_IN_CODE[ty] not in handle:
                        handle[CHILD_IN_CODE[ty]] = "NullRoute"
                    config = {"route": handle}
                else:
                    continue
                name = f"{path.relative_to(checkout)}#{i}"
                cases.append(Case(name, json.dumps(config), expects_refusal(source, m.start(), m.end())))
    return cases


def without_binary_protocols(text: str) -> str:
    """The config with `protocol: caret/thrift` (pool field or server suffix) removed."""
    text = re.sub(r'"protocol"\s*:\s*"(caret|thrift)"\s*,?', "", text)
    return re.sub(r'(:\d+):(caret|thrift)"', r'\1"', text)


def check(text: str, path: Path | None = None) -> subprocess.CompletedProcess:
    if path is not None:
        return run("--config-params", HARNESS_PARAMS, path)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        f.write(text)
        f.flush()
        return run("--config-params", HARNESS_PARAMS, f.name)


def reason_of(out: subprocess.CompletedProcess) -> str:
    last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "?"
    return re.sub(r"`[^`]*`|\"[^\"]*\"", "…", last.split(": ", 2)[-1])[:100]


def test_configs(cases: list[Case], listing: bool) -> tuple[collections.Counter, collections.Counter]:
    counts: collections.Counter = collections.Counter()
    reasons: collections.Counter = collections.Counter()
    for case in cases:
        out = check(case.text, case.path)
        if out.returncode == 0:
            verdict = "loads with warnings" if "warning" in out.stderr else "loads clean"
        elif case.expect_refused:
            verdict = "refused, as mcrouter refuses it"
        elif "protocol" in out.stderr and (plain := check(without_binary_protocols(case.text))).returncode == 0:
            verdict = "refused only for caret/thrift pools"
        else:
            verdict = "refused"
            if "protocol" in out.stderr:
                out = plain  # the reason that remains without caret/thrift
            reasons[reason_of(out)] += 1
        counts[verdict] += 1
        if listing:
            print(f"  {verdict:40s} {case.name}" + (f": {reason_of(out)}" if out.returncode else ""))
    return counts, reasons


def report(title: str, counts: collections.Counter) -> None:
    total = sum(counts.values())
    loads = counts["loads clean"] + counts["loads with warnings"]
    print(
        f"{title}: {loads} of {total} load ({counts['loads clean']} clean, {counts['loads with warnings']} with "
        f"warnings); refused: {counts['refused, as mcrouter refuses it']} as mcrouter refuses them, "
        f"{counts['refused only for caret/thrift pools']} only for caret/thrift pools, {counts['refused']} others"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkout", type=Path, help="a directory with mcrouter's source tree")
    ap.add_argument("--list", action="store_true", help="print every test config with its verdict")
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
    everything: collections.Counter = collections.Counter()
    all_reasons: collections.Counter = collections.Counter()
    for title, cases in (
        ("test configs (*.json)", json_cases(args.checkout)),
        ("test configs (C++ tests)", cpp_cases(args.checkout)),
    ):
        counts, reasons = test_configs(cases, args.list)
        report(title, counts)
        everything.update(counts)
        all_reasons.update(reasons)
    report("test configs, all", everything)
    for reason, n in all_reasons.most_common(15):
        print(f"  {n:3d}  {reason}")


if __name__ == "__main__":
    main()
