"""The forks' development set, run as a user runs it: each deploy prototxt through caffe2jax
and, from the .caffemodel caffe2jax writes, through OpenCV dnn; one markdown row per model
(runs, agreement relative to each output's largest magnitude, seconds).

    python scripts/fork_table.py [NAME ...]

Each model runs in its own process (memory is returned between models).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def row(name: str) -> str:
    """One model in this process: the markdown row."""
    sys.path.insert(0, str(ROOT))
    from tests import fork_runs

    start = time.perf_counter()
    try:
        model = fork_runs.compile_model(name)
        params, state = fork_runs.random_weights(model)
        inputs = fork_runs.random_inputs(model)
        ours = fork_runs.run_ours(model, params, state, inputs)
        finite = all(bool((v == v).all()) and abs(v).max() < float("inf") for v in ours.values())
        mine = "yes" if finite else "not finite"
    except Exception as err:  # noqa: BLE001 - the table reports it
        return f"| {name} | no: {str(err).splitlines()[0][:120]} | — | — | |"
    seconds = time.perf_counter() - start
    try:
        with tempfile.TemporaryDirectory() as folder:
            theirs = fork_runs.run_opencv(name, model, params, state, inputs, Path(folder))
        agree = f"{fork_runs.max_relative(ours, theirs):.1e}"
        cv = "yes"
    except Exception as err:  # noqa: BLE001
        cv, agree = f"no: {str(err).splitlines()[0][-100:]}", "—"
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in ours.items())
    return f"| {name} | {mine} ({seconds:.0f} s) | {cv} | {agree} | {shapes} |"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        print(row(argv[1]), flush=True)
        return 0
    sys.path.insert(0, str(ROOT))
    from tests import fork_runs

    names = argv or fork_runs.deploy_names()
    print("| model | caffe2jax runs | OpenCV runs | max diff / max magnitude | compared |")
    print("|---|---|---|---|---|")
    for name in names:
        done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True,
                              text=True, check=False)  # fmt: skip
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("| ")]
        print(lines[-1] if lines else f"| {name} | crashed (rc {done.returncode}) | | | |",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
