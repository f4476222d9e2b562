"""Which XLA:CPU library paths (``--sweep flags``) and which internal layout (``--sweep
layout``: the channels-last pass on or off) pay, on caffe2jax's CPU-table cases.

    python benchmarks/xla_flags.py [--sweep flags] [--rounds 2] [--cases lenet,quick,alexnet]

Flags are read once per process, so each setting runs ``benchmarks/cpu_table.py --ours-only``
in its own process; settings are visited round-robin ``--rounds`` times so a load change on a
shared machine spreads over all of them, and each cell is the median over rounds. Every
flag setting names every flag explicitly, so the CLI's own defaults do not leak in. A setting
whose process dies (an instruction this CPU lacks: SIGILL) is reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, machine  # noqa: E402

OFF = {
    "xla_cpu_use_xnnpack": "false",
    "xla_cpu_use_onednn": "false",
    "xla_cpu_experimental_xnn_graph_fusion_mode": "XNN_GRAPH_FUSION_MODE_DISABLED",
}
SETTINGS = {
    "jaxlib defaults (no XLA_FLAGS)": None,
    "all library paths off (Eigen)": {},
    "xnnpack": {"xla_cpu_use_xnnpack": "true"},
    "xnnpack + graph fusion greedy": {
        "xla_cpu_use_xnnpack": "true",
        "xla_cpu_experimental_xnn_graph_fusion_mode": "XNN_GRAPH_FUSION_MODE_GREEDY",
    },
    "xnn fusion dot,eltwise,reduce": {"xla_cpu_experimental_xnn_fusion_type": "dot,eltwise,reduce"},
    "onednn": {"xla_cpu_use_onednn": "true"},
    "onednn + fusion dot,eltwise": {
        "xla_cpu_use_onednn": "true",
        "xla_cpu_experimental_onednn_fusion_type": "dot,eltwise",
    },
    "ynn individual conv+dot": {
        "xla_cpu_experimental_ynn_fusion_type": "individual_convolution,individual_dot"
    },
}


LAYOUTS = {
    "NCHW (pass off)": {"CAFFE2JAX_CHANNELS_LAST": "0"},
    "NHWC (channels-last pass)": {"CAFFE2JAX_CHANNELS_LAST": "1"},
}


def flags(setting: dict[str, str]) -> str:
    return " ".join(f"--{k}={v}" for k, v in {**OFF, **setting}.items())


def environment(sweep: str, setting: dict[str, str] | None) -> dict[str, str]:
    if setting is None:
        return {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if sweep == "layout":
        return {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, **setting}
    return {**os.environ, "XLA_FLAGS": flags(setting)}


def run_once(env: dict[str, str], cases: str, out: Path) -> dict[str, float] | str:
    script = Path(__file__).resolve().parent / "cpu_table.py"
    done = subprocess.run([sys.executable, str(script), "--ours-only", "--cases", cases, "--out",
                           str(out)], env=env, capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        return f"died (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}"
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    return {r["case"]: r["ours_ms"] for r in rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cases", default="lenet,quick,cifar_full,alexnet")
    parser.add_argument("--sweep", choices=["flags", "layout"], default="flags")
    parser.add_argument("--settings", help="comma-separated subset of the setting names")
    args = parser.parse_args()
    table = SETTINGS if args.sweep == "flags" else LAYOUTS
    names = args.settings.split(",") if args.settings else list(table)
    times: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    died: dict[str, str] = {}
    tmp = Path(tempfile.mkdtemp(prefix="caffe2jax-flags-"))
    for r in range(args.rounds):
        for i, name in enumerate(names):
            if name in died:
                continue
            got = run_once(environment(args.sweep, table[name]), args.cases, tmp / f"{r}-{i}")
            print(f"round {r} {name}: {got}", flush=True)
            if isinstance(got, str):
                died[name] = got
                continue
            for case, ms in got.items():
                times[name].setdefault(case, []).append(ms)
    names = [n for n in names if n not in died]
    cases = list(times[names[0]])
    lines = ["| XLA_FLAGS setting | " + " | ".join(cases) + " |",
             "|---" * (len(cases) + 1) + "|"]  # fmt: skip
    base = {c: statistics.median(times[names[0]][c]) for c in cases}
    for name in names:
        cells = []
        for c in cases:
            ms = statistics.median(times[name][c])
            cells.append(f"{ms:.2f} ms ({ms / base[c]:.2f}×)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, why in died.items():
        lines.append(f"| {name} | {why} |" + " |" * (len(cases) - 1))
    info = machine()
    head = (f"{info['cpu']}, {info['cores']} cores, load {info['load_avg']}, jax {info['jax']}; "
            f"median of {args.rounds} rounds, ratio to the first row")  # fmt: skip
    text = head + "\n\n" + "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"sweep-{args.sweep}.md").write_text(text + "\n")
    (RESULTS / f"sweep-{args.sweep}.json").write_text(json.dumps(
        {"machine": info, "settings": {n: table[n] for n in names}, "times": times,
         "died": died}, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
