"""Where a compiled step spends its time: XLA's per-op (thunk) times from a ``jax.profiler``
trace, each op named by the Python line that emitted it (the optimized HLO's metadata), and the
PyTorch peer's operators from ``torch.profiler`` — the "profile first" of issue 39.

    python benchmarks/op_profile.py ssd|frcnn|segnet|crnn|rfcn [--calls 3] [--top 25] [--peer]
    python benchmarks/op_profile.py googlenet|resnet50 [--batch 1] [--peer]   # vs onnxruntime

The case's own benchmark builds the runners (benchmarks/ssd_train.py, frcnn_train.py,
segnet_train.py, crnn_train.py). XLA_FLAGS gets ``--xla_dump_to`` (the optimized HLO: each
op's shape and the JAX op that emitted it) before jax starts; the trace's per-op events are
summed over ``--calls`` calls (ops on the two threads overlap, so the sum may exceed the wall
time) and grouped by kind of op (forward or backward; a library call or the JAX primitive a
fusion came from). Figures from a shared machine are noisy: read the shares, not the milliseconds.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

DUMP = Path(tempfile.mkdtemp(prefix="c2j_hlo_"))
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={DUMP} --xla_dump_hlo_as_text"
).strip()
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) .*?metadata=\{([^}]*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def hlo_ops(dump: Path = DUMP) -> dict[str, tuple[str, str]]:
    """Instruction name → (its shape, the JAX op_name that emitted it), from every optimized
    HLO module dumped (the metadata's source lines are stack-frame ids there, not files).
    Names repeat across modules (a forward ``jit(apply)`` run before the step has its own
    ``ynn_fusion.30``): the largest module, the step, is read last so that its names win."""
    out = {}
    for path in sorted(dump.glob("*after_optimizations.txt"), key=lambda p: p.stat().st_size):
        for line in path.read_text().splitlines():
            m = _INSTR.match(line)
            if m:
                name = _OP_NAME.search(m.group(3))
                out[m.group(1)] = (m.group(2), name.group(1) if name else "")
    return out


def kind(name: str, op_name: str) -> str:
    """'fwd'/'bwd' (inside autodiff's transpose) and what the op is: a library call (ynn/onednn
    fusion, custom call) or the JAX primitive the fusion came from."""
    where = "bwd" if "transpose(jvp" in op_name else "fwd"
    base = name.split(".")[0]
    library = base in ("ynn_fusion", "onednn_fusion", "custom-call")
    what = base if library else op_name.split("/")[-1]
    return f"{where} {what}"


def trace_ops(run, calls: int) -> tuple[dict[str, float], float]:
    """Per-op microseconds per call of ``run()`` (already warm), and the wall ms per call."""
    folder = tempfile.mkdtemp(prefix="c2j_trace_")
    start = time.perf_counter()
    with jax.profiler.trace(folder, create_perfetto_trace=True):
        for _ in range(calls):
            jax.block_until_ready(run())
    wall = (time.perf_counter() - start) / calls * 1e3
    trace = next(Path(folder).rglob("perfetto_trace.json.gz"))
    events = json.load(gzip.open(trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    times: dict[str, float] = collections.Counter()
    for e in events:
        if e.get("ph") == "X":
            times[e["name"]] += e.get("dur", 0.0) / calls
    return times, wall


def table(times: dict[str, float], ops: dict[str, tuple[str, str]], top: int) -> str:
    """Two tables: ms per call by kind of op (:func:`kind`), then the costliest ops."""
    timed = {k: v for k, v in times.items() if k in ops}
    total = sum(timed.values()) / 1e3
    by_kind: dict[str, float] = collections.Counter()
    for name, us in timed.items():
        by_kind[kind(name, ops[name][1])] += us
    lines = [f"ops summed: {total:.1f} ms per call", "", "| kind | ms | share |", "|---|---|---|"]
    for what, us in sorted(by_kind.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"| {what} | {us / 1e3:.2f} | {us / 1e3 / total:.1%} |")
    lines += ["", "| op | ms | shape | op_name |", "|---|---|---|---|"]
    for name, us in sorted(timed.items(), key=lambda kv: -kv[1])[:top]:
        shape, op_name = ops[name]
        lines.append(f"| {name} | {us / 1e3:.2f} | {shape} | {op_name[-70:]} |")
    return "\n".join(lines)


def runners(case: str):
    """(caffe2jax's call, the peer's call) of a fork benchmark, both warm-up-ready."""
    if case == "ssd":
        import ssd_train
        from ssd_torch import torch_runner

        net = ssd_train.net_param(4, 300)
        x, label = ssd_train.batch_data(4, 300)
        ours, priors = ssd_train.caffe2jax_runner(net, x, label, "auto")
        peer = torch_runner(net, x, label, priors, ssd_train.LR, ssd_train.MOMENTUM,
                            ssd_train.DECAY)  # fmt: skip
        return (lambda: ours(1)), (lambda: peer(1))
    if case == "frcnn":
        import frcnn_train

        return frcnn_train.ours(Path(tempfile.mkdtemp())), frcnn_train.peer()
    if case == "segnet":
        import numpy as np
        import segnet_train
        import torch

        rng = np.random.default_rng(0)
        x = rng.uniform(0, 255, (4, 3, 72, 96)).astype(np.float32)
        y = rng.integers(0, 12, (4, 1, 72, 96)).astype(np.float32)
        ours = segnet_train.caffe2jax_step(4, 72, 96)
        peer = segnet_train.torch_step(torch, segnet_train.class_weights())
        xt, yt = torch.from_numpy(x), torch.from_numpy(y[:, 0]).long()
        return (lambda: ours(x, y, 1)), (lambda: peer(xt, yt, 1))
    if case == "crnn":
        import crnn_train
        from crnn_torch import torch_runner

        from examples.crnn.make_textlines import make_set

        net, solver = crnn_train.net_param(32, 1.0), crnn_train.solver_param()
        x, label = make_set(32, seed=0)
        ours, params = crnn_train.caffe2jax_runner(net, x, label, solver)
        peer = torch_runner(net, params, x, label, solver)
        return (lambda: ours(1)), (lambda: peer(1))
    if case == "rfcn":
        import shutil

        import rfcn_train
        from google.protobuf import text_format
        from rfcn_torch import torch_runner

        from caffe2jax.frontend import caffe_pb2

        work = Path(tempfile.mkdtemp())
        solver = rfcn_train.ours(work, 224)
        net = text_format.Parse((work / "train.prototxt").read_text(), caffe_pb2.NetParameter())
        twin = lambda b, d, i, g: torch_runner(net, b, d, i, g, 1e-3, 0.9, 5e-4)  # noqa: E731
        _, peer = rfcn_train.agreement(solver, twin)
        shutil.rmtree(DUMP)  # the init's BatchNorm statistics and the forward: not the step
        return (lambda: solver.step(1)), peer
    if case in ("googlenet", "resnet50"):
        return inference(case, BATCH)
    known = "ssd, frcnn, segnet, crnn, rfcn, googlenet or resnet50"
    raise SystemExit(f"unknown case {case!r}: {known}")


BATCH = 1


def inference(case: str, batch: int):
    """GoogLeNet / ResNet-50 forward (benchmarks/onnx_runtime.py's nets and weights): the jitted
    apply, and an onnxruntime session on caffe2jax's export with ``enable_profiling`` (its
    per-node JSON is summarised by :func:`ort_table`)."""
    import numpy as np
    import onnx_runtime
    import onnxruntime as ort

    import caffe2jax

    folder = Path(tempfile.mkdtemp())
    net = onnx_runtime.GOOGLENET if case == "googlenet" else \
        onnx_runtime.resnet50(folder / "r50.prototxt", batch)  # fmt: skip
    model = caffe2jax.compile(net, input_shapes={"data": (batch, 3, 224, 224)})
    params, state = onnx_runtime.weights(model)
    path = caffe2jax.export_onnx(model, params, state, folder / "net.onnx", outputs=["prob"])
    x = np.random.default_rng(0).uniform(0, 1, (batch, 3, 224, 224)).astype(np.float32)
    forward = jax.jit(lambda p, s, v: model.apply(p, s, {"data": v})[0]["prob"])
    params, state, xj = jax.device_put((params, state, x))
    params = model.packed(params)  # oneDNN's weights packed once, as Net.forward runs it
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / "ort")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    peer = lambda: session.run(["prob"], {"data": x})  # noqa: E731
    peer.session = session
    return (lambda: forward(params, state, xj)), peer


def ort_table(session, top: int) -> str:
    """onnxruntime's profile: µs per run by node type (its fused kernels keep their names)."""
    events = json.loads(Path(session.end_profiling()).read_text())
    runs = sum(1 for e in events if e.get("name") == "model_run") or 1
    by_op: dict[str, float] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"] / runs
    total = sum(by_op.values()) / 1e3
    lines = [
        f"onnxruntime nodes: {total:.2f} ms per run",
        "",
        "| op | ms | share |",
        "|---|---|---|",
    ]
    for op, us in sorted(by_op.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"| {op} | {us / 1e3:.2f} | {us / 1e3 / total:.1%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--peer", action="store_true", help="also profile the peer")
    parser.add_argument("--batch", type=int, default=1, help="googlenet/resnet50 only")
    args = parser.parse_args()
    global BATCH
    BATCH = args.batch
    ours, peer = runners(args.case)
    for _ in range(2):
        jax.block_until_ready(ours())
    times, wall = trace_ops(ours, args.calls)
    print(f"{args.case}: caffe2jax {wall:.1f} ms per call (traced), load {os.getloadavg()[0]:.2f}")
    print(table(times, hlo_ops(), args.top))
    if args.peer and hasattr(peer, "session"):
        for _ in range(args.calls + 1):
            peer()
        print(ort_table(peer.session, args.top))
    elif args.peer:
        import torch

        peer()
        with torch.profiler.profile() as prof:
            for _ in range(args.calls):
                peer()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
