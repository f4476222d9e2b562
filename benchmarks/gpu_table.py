"""The GPU table of issue 13: forward + backward of AlexNet, GoogLeNet and VGG-16 on one GPU.

    python benchmarks/gpu_table.py [--cases alexnet128,...] [--precisions fp32,tf32,bf16]
                                   [--calls 10] [--blocks 5] [--out OUT]

Each row is one net at one batch size and precision: caffe2jax's fused forward + backward
program (``value_and_grad`` of the net's loss, as ``caffe2jax time`` times it) against a
PyTorch eager twin of the same layers with the same params (``torch_net.py``), timed in
alternating blocks (median block after warm-up; compile time apart). Beside them: images/s,
peak memory, the share of the device's peak FLOP/s, and MyCaffe's published Titan Xp figures
where it published one. Precisions: ``fp32`` (no TF32 anywhere: JAX ``highest``; torch with
``allow_tf32`` off), ``tf32`` (TF32 matrix units on both sides), ``bf16`` (caffe2jax's bf16
compute with fp32 master weights; torch autocast to bfloat16). FLOPs count the
convolutions and inner products, forward and backward (both sides do the same arithmetic).
Peak memory: for caffe2jax XLA's buffer assignment of the program (params, inputs, outputs
and temporaries); for torch the caching allocator's ``max_memory_allocated`` over the timed calls.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import torch_net  # noqa: E402
from harness import Row, measure  # noqa: E402

ROOT = Path(__file__).resolve().parent
MODELS = ROOT.parents[1] / "shared/caffe/models/models"
NETS = {
    "alexnet128": ("AlexNet", MODELS / "bvlc_alexnet/train_val.prototxt", 128, 227),
    "googlenet64": ("GoogLeNet", MODELS / "bvlc_googlenet/train_val.prototxt", 64, 224),
    "googlenet128": ("GoogLeNet", MODELS / "bvlc_googlenet/train_val.prototxt", 128, 224),
    "vgg16_32": ("VGG-16", ROOT / "nets/vgg16_train.prototxt", 32, 224),
}
# MyCaffe's published fwd+bwd times on a Titan Xp (ms); the only rows it published.
MYCAFFE_TITAN_XP_MS = {"googlenet64": 305.0, "vgg16_32": 350.0}
# Dense datasheet peaks (TFLOP/s) by device kind: FP32 (CUDA cores), TF32 and BF16 tensor cores.
PEAK_TFLOPS = {
    "H100 80GB HBM3": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4},
    "H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4},
}


@dataclass
class GpuRow(Row):
    precision: str = "fp32"
    batch: int = 0
    gflops: float = 0.0
    ours_mem_gib: float = 0.0
    peer_mem_gib: float = 0.0
    ours_loss: float = 0.0
    peer_loss: float = 0.0
    mycaffe_ms: float | None = None


class Synced:
    """A torch result that ``jax.block_until_ready`` waits for (it calls this method)."""

    def block_until_ready(self):
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return self


def _torch_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _batch(n: int, size: int):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (n, 3, size, size)).astype(np.float32)
    return x, rng.integers(0, 1000, n).astype(np.float32)


def model_flops(model, params, state, inputs) -> float:
    """Multiply-adds ×2 of the convolutions and inner products, forward + backward: each
    layer's forward, its weight gradient and (unless its bottom is a net input, which needs
    none) its bottom gradient cost the same."""
    import jax

    key = jax.random.key(0)
    blobs = jax.eval_shape(lambda p, s, v: model.apply(p, s, v, key)[0], params, state, inputs)
    total = 0.0
    for layer in model.net.layers:
        if layer.type not in ("Convolution", "InnerProduct"):
            continue
        top = blobs[layer.top_names[0]].shape
        weights = params[layer.name][0].shape
        per_output = np.prod(weights[1:]) if layer.type == "Convolution" else weights[-1]
        forward = 2.0 * np.prod(top) * per_output
        total += forward * (2 if layer.bottom_names[0] in inputs else 3)
    return total


def ours(prototxt: Path, n: int, size: int, precision: str, row: GpuRow):
    """caffe2jax's fused fwd+bwd of the TRAIN net: a runner; fills row's FLOPs and memory."""
    import jax

    from caffe2jax.lowering.model import compile as compile_net

    model = compile_net(prototxt, "TRAIN", input_shapes={"data": (n, 3, size, size),
                        "label": (n,)}, precision=precision)  # fmt: skip
    params, state = model.init(0)
    x, y = _batch(n, size)
    inputs = {"data": jax.device_put(x), "label": jax.device_put(y)}
    key = jax.random.key(1)
    fb = jax.value_and_grad(lambda p, s, v: model.loss(p, s, v, key)[0])
    lowered = jax.jit(fb).lower(params, state, inputs)
    row.gflops = model_flops(model, params, state, inputs) / 1e9
    start = time.perf_counter()
    program = lowered.compile()
    row.compile_s = time.perf_counter() - start
    m = program.memory_analysis()
    if m is not None:
        used = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
        row.ours_mem_gib = (used - m.alias_size_in_bytes) / 2**30
    row.ours_loss = float(program(params, state, inputs)[0])
    return (lambda: program(params, state, inputs)), model, params


def peer(model, params, n: int, size: int, precision: str, row: GpuRow):
    """The PyTorch eager twin's fwd+bwd, as a runner (cudnn autotuning on, NCHW)."""
    import contextlib

    import torch

    torch.backends.cudnn.benchmark = True
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    device = _torch_device()
    forward, tensors = torch_net.twin(model, {k: [np.asarray(b) for b in v]
                                              for k, v in params.items()}, device)  # fmt: skip
    x, y = (torch.tensor(a, device=device) for a in _batch(n, size))

    def autocast():
        if precision == "bf16":
            return torch.autocast(device, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def run():
        for t in tensors:
            t.grad = None
        with autocast():
            loss = forward({"data": x, "label": y})
        loss.backward()
        return Synced()

    with autocast():
        row.peer_loss = float(forward({"data": x, "label": y}))
    run().block_until_ready()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    return run


def gpu_row(case: str, precision: str, calls: int, blocks: int, batch: int = 0) -> GpuRow:
    """One row; ``batch`` overrides the net's batch size (a smoke run on CPU)."""
    import torch

    name, prototxt, n, size = NETS[case]
    n = batch or n
    row = GpuRow(f"{name} b{n}", "PyTorch eager", precision=precision, batch=n,
                 mycaffe_ms=MYCAFFE_TITAN_XP_MS.get(case))  # fmt: skip
    run, model, params = ours(prototxt, n, size, precision, row)
    compile_s = row.compile_s
    measure(row, run, lambda: peer(model, params, n, size, precision, row), calls, blocks)
    row.compile_s = compile_s  # measure() times the (already compiled) first call
    if torch.cuda.is_available():
        row.peer_mem_gib = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.empty_cache()
    return row


def matmul_ceiling() -> dict[str, float]:
    """TFLOP/s of an 8192³ (CPU: 512³) matrix product through JAX in each precision: the
    measured roof."""
    import jax
    import jax.numpy as jnp

    n, out = (8192 if jax.default_backend() == "gpu" else 512), {}
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    for prec, dtype, mode in (("fp32", jnp.float32, "highest"),
                              ("tf32", jnp.float32, "tensorfloat32"),
                              ("bf16", jnp.bfloat16, "default")):  # fmt: skip
        x = a.astype(dtype)
        f = jax.jit(lambda u, v, m=mode: jnp.dot(u, v, precision=m))
        f(x, x).block_until_ready()
        start = time.perf_counter()
        for _ in range(10):
            r = f(x, x)
        r.block_until_ready()
        out[prec] = 2 * n**3 * 10 / (time.perf_counter() - start) / 1e12
    return out


def peak_share(row: GpuRow, kind: str) -> float | None:
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in kind), None)
    if not peak or not row.ours_ms:
        return None
    return row.gflops / row.ours_ms / peak[row.precision] * 100  # GFLOP/ms = TFLOP/s


def markdown(rows: list[GpuRow], info: dict) -> str:
    kind = info["device"]
    roof = ", ".join(f"{k} {v:.0f}" for k, v in info["matmul_tflops"].items())
    lines = [
        f"### GPU table: fwd+bwd, {kind}",
        "",
        f"jax {info['jax']}, torch {info.get('torch')}; JAX 8192³ matmul measured (TFLOP/s): "
        f"{roof}",
        "",
        "| net | precision | caffe2jax | img/s | peak mem | % of peak | PyTorch eager | img/s "
        "| peak mem | ratio | MyCaffe Titan Xp | compile |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        share = peak_share(r, kind)
        lines.append(
            f"| {r.case} | {r.precision} | {r.ours_ms:.1f} ms | {r.batch / r.ours_ms * 1e3:.0f} "
            f"| {r.ours_mem_gib:.1f} GiB | {f'{share:.0f} %' if share else '—'} "
            f"| {r.peer_ms:.1f} ms | {r.batch / r.peer_ms * 1e3:.0f} | {r.peer_mem_gib:.1f} GiB "
            f"| {r.ratio:.2f}× | {f'{r.mycaffe_ms:.0f} ms' if r.mycaffe_ms else '—'} "
            f"| {r.compile_s:.1f} s |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(NETS))
    parser.add_argument("--precisions", default="fp32,tf32,bf16")
    parser.add_argument("--calls", type=int, default=10, help="calls per timed block")
    parser.add_argument("--blocks", type=int, default=5, help="timed blocks per side (≥ 5)")
    parser.add_argument("--out", type=Path, help="write OUT.json/OUT.md instead of results/")
    parser.add_argument("--batch", type=int, default=0, help="override batch sizes (smoke run)")
    args = parser.parse_args(argv)
    import jax

    info = harness.machine()
    info["device"] = jax.devices()[0].device_kind
    info["matmul_tflops"] = matmul_ceiling()
    rows = []
    for case in args.cases.split(","):
        for precision in args.precisions.split(","):
            row = gpu_row(case, precision, args.calls, args.blocks, args.batch)
            rows.append(row)
            print(f"  {row.case} {precision}: {row.ours_ms:.1f} ms vs torch {row.peer_ms:.1f} ms "
                  f"({row.ratio:.2f}×); losses {row.ours_loss:.3f} / {row.peer_loss:.3f}; "
                  f"{row.gflops:.0f} GFLOP", flush=True)  # fmt: skip
            if args.out:  # the rows so far, in case a later row runs out of time
                args.out.with_suffix(".partial.md").write_text(markdown(rows, info))
    text = markdown(rows, info)
    command = "python benchmarks/gpu_table.py " + " ".join(argv or sys.argv[1:])
    harness.write("gpu", "GPU table", rows, info, command.strip(), args.out, text=text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
