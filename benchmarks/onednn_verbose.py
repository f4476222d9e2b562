"""Where oneDNN's time goes in one compiled train step: its own per-primitive execution times
(oneDNN's verbose mode), each call attributed to a role and a layer kind — the "measure first"
of issue 39 item 1 (are the weight reorders around each call worth cutting?).

    python benchmarks/onednn_verbose.py [--case ssd] [--batch 4] [--size 300] [--engines auto]
    ONEDNN_VERBOSE=1 python any_program.py > log; python benchmarks/onednn_verbose.py --log log

The case's train step (benchmarks/ssd_train.py) is compiled and run twice, then oneDNN's
verbose level is raised (``dnnl_set_verbose``) for one more step, whose ``onednn_verbose,exec``
lines (C stdout, captured through its file descriptor) are summed by role: the convolution
primitives (forward, backward data, backward weights) and the reorders around them (weights
into a primitive's blocked format before its call; diff weights back to Caffe's layout after a
backward-weights call), by layer kind (depthwise, 1×1, k×k). Figures from a shared machine are
noisy: read the shares, and the load printed with them.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import re
import sys
import tempfile
import time
from pathlib import Path

_PROBLEM = re.compile(r"([a-z]+)(\d+)")


def layer_kind(problem: str) -> str:
    """'depthwise' / '1x1' / 'kxk' from a convolution's oneDNN problem string
    (``g32mb4_ic32oc32_ih150oh150kh3…``: a group count equal to the channels is depthwise)."""
    fields = dict(_PROBLEM.findall(problem.replace("_", " ")))
    if "g" in fields and fields["g"] == fields.get("ic"):
        return "depthwise"
    return "1x1" if fields.get("kh") == "1" and fields.get("kw") == "1" else "kxk"


def _weights_format(memory_descriptors: str) -> str:
    """The blocked format of a convolution's weights (or diff weights) in its verbose line."""
    for md in memory_descriptors.split():
        if md.startswith(("wei_", "diff_wei_")):
            return md.split(":")[3]
    return ""


def roles(lines: list[str]) -> dict[tuple[str, str], list[float]]:
    """(role, layer kind) → the execution times (ms) of the verbose ``exec`` lines. XLA runs
    calls on two threads, so lines interleave: a reorder is matched to its convolution by its
    layer kind (from its dims: ``g×1×1×kh×kw`` is depthwise) and the blocked format it writes
    (weights into a forward or backward-data call) or reads (a backward-weights call's diff
    weights), the one that convolution's line names."""
    calls = [line.strip().split(",") for line in lines if line.startswith("onednn_verbose,exec")]
    prop = {  # weights go into forward and backward-data calls, diff weights out of the other
        (layer_kind(f[-2]), _weights_format(f[6]), f[5] != "backward_weights"): f[5]
        for f in calls
        if f[3] == "convolution"
    }
    out: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for f in calls:
        if f[3] == "convolution":
            out[(f[5], layer_kind(f[-2]))].append(float(f[-1]))
            continue
        if f[3] != "reorder":
            out[(f[3], "-")].append(float(f[-1]))
            continue
        source, dest = (md.split(":")[3] for md in f[6].split()[:2])
        dims = f[-2].split("x")
        kind = ("depthwise" if len(dims) == 5 and dims[1:3] == ["1", "1"] else
                "1x1" if dims[-2:] == ["1", "1"] else "kxk")  # fmt: skip
        into = source in ("abcd", "abcde")
        near = prop.get((kind, dest if into else source, into), "?")
        role = f"reorder {'weights before' if into else 'diff weights after'} {near}"
        out[(role, kind)].append(float(f[-1]))
    return out


def table(times: dict[tuple[str, str], list[float]]) -> str:
    total = sum(sum(v) for v in times.values())
    rows = ["| role | layer kind | calls | ms | share |", "|---|---|---|---|---|"]
    for (role, kind), v in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        rows.append(f"| {role} | {kind} | {len(v)} | {sum(v):.1f} | {100 * sum(v) / total:.1f} % |")
    reorders = sum(sum(v) for (role, _), v in times.items() if role.startswith("reorder"))
    rows.append(f"| all reorders | | | {reorders:.1f} | {100 * reorders / total:.1f} % |")
    rows.append(f"| all oneDNN | | {sum(map(len, times.values()))} | {total:.1f} | 100 % |")
    return "\n".join(rows)


def verbose_step(run, step: int) -> tuple[list[str], float]:
    """``run(step)`` with oneDNN's verbose lines captured; (the lines, the step's ms)."""
    from caffe2jax.lowering.engines import onednn

    lib, libc = onednn._dnnl(), ctypes.CDLL(None)  # noqa: SLF001 - the loaded library
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile("w+") as capture:
        os.dup2(capture.fileno(), 1)
        try:
            lib.dnnl_set_verbose(2)
            start = time.perf_counter()
            run(step)
            ms = (time.perf_counter() - start) * 1e3
            lib.dnnl_set_verbose(0)
            libc.fflush(None)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        capture.seek(0)
        return capture.read().splitlines(), ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="ssd", choices=("ssd",))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--engines", default="auto")
    parser.add_argument("--log", help="sum an ONEDNN_VERBOSE=1 log of any program instead")
    args = parser.parse_args()
    if args.log:
        print(table(roles(Path(args.log).read_text().splitlines())))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ssd_train import batch_data, caffe2jax_runner, net_param

    x, label = batch_data(args.batch, args.size)
    run, _ = caffe2jax_runner(net_param(args.batch, args.size), x, label, args.engines)
    run(0), run(1)  # compile, warm up
    quiet = []
    for step in (2, 3):
        start = time.perf_counter()
        run(step)
        quiet.append((time.perf_counter() - start) * 1e3)
    lines, ms = verbose_step(run, 4)
    times = roles(lines)
    load = os.getloadavg()[0]
    print(f"MobileNet-SSD train step b{args.batch} {args.size}x{args.size}, engines "
          f"{args.engines}: {min(quiet):.0f} ms (verbose off), {ms:.0f} ms with oneDNN's "
          f"verbose on; load {load:.1f}\n")  # fmt: skip
    print(table(times))


if __name__ == "__main__":
    main()
