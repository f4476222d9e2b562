"""Start-up of pycaffe scripts and of ``caffe2jax time`` (issue 23 item 5), each in fresh
processes, side by side with OpenCV's dnn module.

* GoogLeNet deploy (batch 10): a pycaffe script ``caffe.Net(deploy, weights, caffe.TEST)`` +
  one ``forward()``, from process launch to its first output; first run on an empty
  compilation cache, second run on the cache the first left; against OpenCV's
  ``readNetFromCaffe`` + ``forward`` in one run. The weights are a .caffemodel our fillers
  wrote (both load the same file).
* ``caffe2jax time`` on ResNet-152 (batch 1, 224², built here with NetSpec): from launch to
  its first per-layer line, first and second run (``--full``: also to the last one). The
  lines come from one profile of the fused program, all at once after it ran
  (``--per-layer-programs`` would print each after its layer's compile).

Each round runs the three scripts back to back (caffe2jax first run, second run, OpenCV), on
a fresh cache folder, so caffe2jax and its peer alternate; the table gives each round's
ratios and the medians. Prints the load average too: timings on a shared machine are noisy,
the ratios (same round) are what to compare.

``--before``: each round also runs the first run with ``CAFFE2JAX_QUICK_FIRST_RUN=0`` (no
quick executable first, runtime/host/first_run.py) on its own fresh cache, and the table adds
its row and each first run's launch → exit.

``--quick-ab``: each round also runs the first run as round 5 had it (the quick executable at
LLVM -O0 alone, ``first_run.FALLBACK_OPTIONS``, XLA's fusion emitters on; the optimised
compile started beside its first call) on its own fresh cache, before the round's three
scripts in odd rounds and after them in even ones, and the table adds its row and its ratio to
the first run's.

    python benchmarks/pycaffe_startup.py [--rounds N] [--full] [--no-time] [--before] [--quick-ab]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOOGLENET = ROOT.parent / "shared/caffe/models/models/bvlc_googlenet/deploy.prototxt"

PYCAFFE = """
import time, sys
start = float(sys.argv[3])
import numpy as np
import caffe2jax as caffe
net = caffe.Net(sys.argv[1], sys.argv[2], caffe.TEST)
net.blobs["data"].data[...] = np.random.default_rng(0).normal(size=net.blobs["data"].shape)
prob = net.forward()["prob"]
print(f"{time.time() - start:.3f} {prob.shape} {prob[0].argmax()}", flush=True)
"""

# the first run with the previous quick options (--quick-ab)
PYCAFFE_O0 = PYCAFFE.replace(
    "import caffe2jax as caffe\n",
    """import caffe2jax as caffe
from caffe2jax.runtime.host import first_run
first_run.QUICK_OPTIONS = first_run.FALLBACK_OPTIONS
first_run.START_AFTER_FIRST_CALL = False
""",
)

OPENCV = """
import time, sys
start = float(sys.argv[3])
import numpy as np
import cv2
net = cv2.dnn.readNetFromCaffe(sys.argv[1], sys.argv[2])
net.setInput(np.random.default_rng(0).normal(size=(10, 3, 224, 224)).astype(np.float32))
prob = net.forward()
print(f"{time.time() - start:.3f} {prob.shape} {prob[0].argmax()}", flush=True)
"""


def resnet152(path: Path) -> None:
    """ResNet-152 (He et al. 2016; the published deploy net's layers) as a prototxt."""
    import caffe2jax as caffe
    from caffe2jax import layers as L
    from caffe2jax import params as P

    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, 224, 224]))

    def conv_bn(bottom, name, out, k, stride=1, pad=0, relu=True):
        c = L.Convolution(bottom, num_output=out, kernel_size=k, stride=stride, pad=pad,
                          bias_term=False, weight_filler=dict(type="msra"))  # fmt: skip
        setattr(n, name, c)
        setattr(n, "bn_" + name, L.BatchNorm(c, in_place=True))
        setattr(n, "scale_" + name, L.Scale(c, bias_term=True, in_place=True))
        if relu:
            setattr(n, name + "_relu", L.ReLU(c, in_place=True))
        return c

    top = conv_bn(n.data, "conv1", 64, 7, 2, 3)
    n.pool1 = top = L.Pooling(top, pool=P.Pooling.MAX, kernel_size=3, stride=2)
    for stage, (blocks, width) in enumerate([(3, 64), (8, 128), (36, 256), (3, 512)], start=2):
        for b in range(blocks):
            name = f"res{stage}{chr(97 + b) if blocks <= 3 else ('a' if b == 0 else f'b{b}')}"
            stride = 2 if b == 0 and stage > 2 else 1
            short = conv_bn(top, name + "_branch1", 4 * width, 1, stride, relu=False) if b == 0 \
                else top  # fmt: skip
            x = conv_bn(top, name + "_branch2a", width, 1, stride)
            x = conv_bn(x, name + "_branch2b", width, 3, 1, 1)
            x = conv_bn(x, name + "_branch2c", 4 * width, 1, relu=False)
            setattr(n, name, L.Eltwise(short, x))
            top = getattr(n, name)
            setattr(n, name + "_relu", L.ReLU(top, in_place=True))
    n.pool5 = L.Pooling(top, pool=P.Pooling.AVE, kernel_size=7, stride=1)
    n.fc1000 = L.InnerProduct(n.pool5, num_output=1000)
    n.prob = L.Softmax(n.fc1000)
    path.write_text('name: "ResNet-152"\n' + str(n.to_proto()))


def launch_to_output(code: str, args: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Seconds from launching ``python -c code args`` to its first printed line (and, in
    :data:`EXITS`, to the process's exit)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    start = time.time()
    done = subprocess.run([sys.executable, f.name, *args, repr(start)], capture_output=True,
                          text=True, env=env, timeout=1800)  # fmt: skip
    EXITS.append(time.time() - start)
    os.unlink(f.name)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    seconds, rest = done.stdout.split(" ", 1)
    return float(seconds), rest.strip()


EXITS: list[float] = []  # launch → exit of each launch_to_output, in order


def time_lines(model: Path, env: dict[str, str], full: bool) -> tuple[float, float | None]:
    """``caffe2jax time``: seconds from launch to the first per-layer line (and, with
    ``full``, to the last, "Average Forward pass"); the process is stopped then."""
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "caffe2jax", "time", "--model", str(model),
                             "--iterations", "1"], stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)  # fmt: skip
    first = last = None
    for line in proc.stderr:
        if first is None and "\tforward: " in line:
            first = time.time() - start
            if not full:
                break
        if "Average Forward pass" in line:
            last = time.time() - start
            break
    proc.kill()
    proc.wait()
    if first is None:
        raise RuntimeError("caffe2jax time printed no per-layer line")
    return first, last


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true", help="also time to the last layer line")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the three scripts")
    parser.add_argument("--no-time", action="store_true", help="skip the `caffe2jax time` rows")
    before = "also a first run with CAFFE2JAX_QUICK_FIRST_RUN=0 each round (first_run.py)"
    parser.add_argument("--before", action="store_true", help=before)
    quick_ab = "also a first run as round 5 had it (-O0 alone, compiles side by side) each round"
    parser.add_argument("--quick-ab", action="store_true", help=quick_ab)
    args = parser.parse_args()
    import caffe2jax

    work = Path(tempfile.mkdtemp(prefix="c2j-startup-"))
    weights = work / "googlenet.caffemodel"
    caffe2jax.Net(str(GOOGLENET), caffe2jax.TEST, seed=0).save(str(weights))
    resnet = work / "resnet152.prototxt"
    resnet152(resnet)
    files = [str(GOOGLENET), str(weights)]
    rows = []
    for k in range(args.rounds):
        env = {**os.environ, "CAFFE2JAX_CACHE_DIR": str(work / f"cache{k}")}
        env.pop("CAFFE2JAX_NO_COMPILE_CACHE", None)
        load = os.getloadavg()[0]
        env_o0 = {**env, "CAFFE2JAX_CACHE_DIR": str(work / f"cache{k}-o0")}
        o0 = launch_to_output(PYCAFFE_O0, files, env_o0)[0] if args.quick_ab and k % 2 else 0
        first, what = launch_to_output(PYCAFFE, files, env)
        first_exit = EXITS[-1]
        second, _ = launch_to_output(PYCAFFE, files, env)
        opencv, peer = launch_to_output(OPENCV, files, env)
        # the first run without the quick executable (runtime/host/first_run.py), own cache
        env_off = {**env, "CAFFE2JAX_CACHE_DIR": str(work / f"cache{k}-off"),
                   "CAFFE2JAX_QUICK_FIRST_RUN": "0"}  # fmt: skip
        slow, _ = launch_to_output(PYCAFFE, files, env_off) if args.before else (first, "")
        slow_exit = EXITS[-1]
        if args.quick_ab and not k % 2:
            o0 = launch_to_output(PYCAFFE_O0, files, env_o0)[0]
        rows.append((load, first, second, opencv, slow, first_exit, slow_exit, o0))
        print(f"round {k}: load {load:.1f}; first {first:.2f} s (exit {first_exit:.2f} s), "
              f"second {second:.2f} s, OpenCV {opencv:.2f} s: {first / opencv:.2f}x, "
              f"{second / opencv:.2f}x", flush=True)  # fmt: skip
        if args.before:
            print(f"  first without the quick executable {slow:.2f} s (exit {slow_exit:.2f} s): "
                  f"{slow / opencv:.2f}x", flush=True)  # fmt: skip
        if args.quick_ab:
            print(f"  first run as round 5's {o0:.2f} s: "
                  f"{o0 / opencv:.2f}x", flush=True)  # fmt: skip
    if not args.no_time:
        t_first = time_lines(resnet, env, args.full)
        t_second = time_lines(resnet, env, args.full)
    print(f"machine: {platform.machine()} {os.cpu_count()} cores; python "
          f"{sys.version.split()[0]}; load average {os.getloadavg()[0]:.1f} at the end "
          "(shared machine, noisy)")  # fmt: skip
    print(f"pycaffe output {what}; OpenCV output {peer}")
    print("| case | caffe2jax | OpenCV dnn | ratio |")
    print("|---|---|---|---|")
    first, second, opencv = (statistics.median(r[i] for r in rows) for i in (1, 2, 3))
    ratios = [statistics.median(r[i] / r[3] for r in rows) for i in (1, 2)]
    print(
        f"| GoogLeNet deploy b10: script launch → first output, first run (empty cache) | "
        f"{first:.2f} s | {opencv:.2f} s | {ratios[0]:.2f}× |"
    )
    print(
        f"| GoogLeNet deploy b10: script launch → first output, second run (cache) | "
        f"{second:.2f} s | {opencv:.2f} s | {ratios[1]:.2f}× |"
    )
    if args.before:
        slow = statistics.median(r[4] for r in rows)
        ratio = statistics.median(r[4] / r[3] for r in rows)
        exits = [statistics.median(r[i] for r in rows) for i in (5, 6)]
        print(f"| GoogLeNet deploy b10: first run, CAFFE2JAX_QUICK_FIRST_RUN=0 | {slow:.2f} s | "
              f"{opencv:.2f} s | {ratio:.2f}× |")  # fmt: skip
        print(f"| launch → exit of the first run, quick first on / off | {exits[0]:.2f} s / "
              f"{exits[1]:.2f} s | — | — |")  # fmt: skip
    if args.quick_ab:
        o0 = statistics.median(r[7] for r in rows)
        ratio = statistics.median(r[7] / r[3] for r in rows)
        gain = statistics.median(r[1] / r[7] for r in rows)
        print(f"| GoogLeNet deploy b10: first run as round 5's (-O0 alone, compiles side by "
              f"side) | {o0:.2f} s | {opencv:.2f} s | {ratio:.2f}× (first run ÷ this: "
              f"{gain:.2f}) |")  # fmt: skip
    if args.no_time:
        return
    for label, (a, b) in (("first run", t_first), ("second run", t_second)):
        last = f"; last layer line {b:.1f} s" if b is not None else ""
        print(
            f"| `caffe2jax time` ResNet-152 b1, launch → first per-layer line, {label} | "
            f"{a:.1f} s{last} | — | — |"
        )


if __name__ == "__main__":
    main()
