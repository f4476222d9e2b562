"""The long fuzz run (issues 14, 25): ``python scripts/fuzz.py --cases 10000 [--seed N]``.

Spreads ``--cases`` over every kind of tests/fuzz (:data:`SHARES`: net and solver prototxt,
weights .caffemodel/.h5, .solverstate/.h5, binaryproto, LMDB/LevelDB Datums with encoded
images, ImageData and HDF5Data lists, the CLI verbs, the pycaffe entry points, the fork
layers' parameters and the newer verbs: tests/fuzz/fork_cases.py), each case in a worker
limited to 4 GiB of address space and 60 s (tests/fuzz/runner.py). Results are appended
to ``--log`` (JSON lines) as chunks finish; ``--table LOG`` prints the table of a log, also of
a run cut short. Exits 1 when any case ended other than in a result or a one-line CaffeError.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fuzz.runner import Result, run  # noqa: E402

SHARES = {  # per 10,000 cases; the CLI and pycaffe cases compile nets (seconds each)
    "net": 1200,
    "solver": 900,
    "weights": 700,
    "weights_h5": 700,
    "solverstate": 850,
    "binaryproto": 500,
    "lmdb": 800,
    "lmdb_images": 800,
    "leveldb": 400,
    "imagedata": 900,
    "hdf5data": 1000,
    "cli": 150,
    "pycaffe": 150,
    "fork_params": 800,  # issue 37: fork layer parameters, compiled and run (a second each)
    "new_verbs": 150,  # issue 37: detect, convert_annoset, rl with hostile rl_param fields
}
COLUMNS = ("unexpected exception", "hang > 60 s", "over 4 GiB", "killed by a signal")


def column(r: Result) -> str:
    """The issue's table column a failed case falls in ("" for a clean one)."""
    if r.status in ("ok", "clean"):
        return ""
    if r.status in ("timeout", "hang"):
        return COLUMNS[1]
    if r.status == "crash":
        return COLUMNS[3]
    return COLUMNS[2] if r.message.startswith("MemoryError") else COLUMNS[0]


def table(results: list[Result]) -> str:
    """The markdown table: cases and failures per kind, and the total."""
    kinds: dict[str, Counter] = {}
    for r in results:
        counts = kinds.setdefault(r.kind, Counter())
        counts["cases"] += 1
        counts[column(r)] += 1
    total = sum(kinds.values(), Counter())
    lines = ["| kind | cases | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for kind, counts in [*sorted(kinds.items()), ("**all**", total)]:
        cells = [str(counts["cases"])] + [str(counts[c]) for c in COLUMNS]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def read_log(path: Path) -> list[Result]:
    return [Result(**json.loads(line)) for line in path.read_text().splitlines() if line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--log", type=Path, default=Path("fuzz-results.jsonl"))
    parser.add_argument("--table", type=Path, help="print the table of an earlier run's log")
    args = parser.parse_args()
    if args.table:
        results = read_log(args.table)
    else:
        counts = {k: max(1, round(n * args.cases / 10000)) for k, n in SHARES.items()}
        start = time.perf_counter()
        with args.log.open("a") as log, tempfile.TemporaryDirectory() as work:

            def sink(chunk: list[Result]) -> None:
                log.writelines(json.dumps(asdict(r)) + "\n" for r in chunk)
                log.flush()

            results = run(counts, args.seed, Path(work), jobs=args.jobs, sink=sink).results
        print(f"{len(results)} cases in {time.perf_counter() - start:.0f} s (seed {args.seed})")
    print(table(results))
    failures = [r for r in results if column(r)]
    for r in failures[:50]:
        print(f"  {r.kind} case {r.index}: {r.status}: {r.message[:300]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
