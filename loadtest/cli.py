"""`squealctl loadtest EXPERIMENT [--short]` (also `python -m loadtest`): run one of the paper's experiments.

Each experiment starts its own servers on free ports, drives them with locust, prints a table and writes
`<out>/<name>.json` and `<out>/<name>.png`. The exit code is 0 when the effect went the paper's way, 1 when
it did not (the table says by how much), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

from loadtest.experiments import EXPERIMENTS, load


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="squealctl loadtest", description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", choices=(*EXPERIMENTS, "all"), help="which experiment ('all': each in turn)")
    p.add_argument("--short", action="store_true", help="the CI form: few users, a few seconds per phase")
    p.add_argument(
        "--client",
        choices=("lease", "stock"),
        default="lease",
        help="herd only: the web servers' memcached client. 'lease' (default): our meta-command lease client, "
        "leases switched in the client. 'stock': pymemcache's plain get/set through the router, leases on = "
        "a pool with the topology's `leases` (the router's transparent leases), off = the same pool without; "
        "reports DB reads per invalidation, written as <out>/herd-stock.json and .png",
    )
    p.add_argument("--out", default="reports", help="where the JSON and PNG go (default %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the servers' work directory (logs) after the run")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    names = EXPERIMENTS if args.experiment == "all" else (args.experiment,)
    if args.client != "lease" and args.experiment != "herd":
        parser().error("--client: only the herd experiment has a stock-client variant")
    failed = []
    for name in names:
        module = load(name)
        work = Path(tempfile.mkdtemp(prefix=f"loadtest-{name}-"))
        options = {"client": args.client} if name == "herd" else {}
        report = module.run(short=args.short, workdir=work, **options)
        json_path, png_path = report.write(args.out)
        print(report.text())
        problems = module.check(report)
        for p in problems:
            print(f"  EFFECT NOT SHOWN: {p}")
        print(f"  wrote {json_path} and {png_path}" + (f"; logs in {work}" if args.keep else ""))
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
        if problems:
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
