"""The larger fuzz run (issue 14): ``python scripts/fuzz.py [--scale 5] [--seed N]``.

Runs the cases of tests/fuzz (the CI suite runs them at scale 1, ~3,000 cases) at a larger
scale and prints, per kind, the number of cases by outcome and the slowest case; exits 1 when
any case ended other than in a result or a one-line CaffeError.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fuzz.runner import run  # noqa: E402
from tests.fuzz.test_fuzz import COUNTS  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    counts = {kind: int(n * args.scale) for kind, n in COUNTS.items()}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        report = run(counts, args.seed, Path(work))
    spent = time.perf_counter() - start
    print(report.summary())
    failures = report.failures()
    print(
        f"{len(report.results)} cases, {len(failures)} failures, {spent:.0f} s (seed {args.seed})"
    )
    for r in failures[:50]:
        print(f"  {r.kind} case {r.index}: {r.status}: {r.message}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
