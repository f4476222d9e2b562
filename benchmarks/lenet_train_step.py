"""LeNet (Caffe's MNIST example), batch 64: caffe2jax's compiled train step vs peers.

Peers, timed in the same process on the same synthetic batch:
  * the same net and update (SGD, momentum 0.9, weight decay 5e-4, Caffe's history rule)
    written by hand in JAX + optax, jitted;
  * PyTorch eager (CPU), if torch is installed.
The ratio caffe2jax / peer is per train step (median of repeated timed blocks).
"""

from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

ROOT = Path(__file__).resolve().parents[1]
LENET = ROOT.parent / "shared/caffe/models/examples/mnist/lenet_train_test.prototxt"
BATCH, STEPS, REPEATS = 64, 50, 7


def caffe2jax_step():
    from caffe2jax.frontend import caffe_pb2
    from caffe2jax.lowering.model import compile as compile_net
    from caffe2jax.runtime.train.step import Trainer

    model = compile_net(
        LENET, "TRAIN", input_shapes={"data": (BATCH, 1, 28, 28), "label": (BATCH,)}
    )
    solver = caffe_pb2.SolverParameter(
        base_lr=0.01, momentum=0.9, weight_decay=5e-4, lr_policy="fixed"
    )
    params, state = model.init(jax.random.key(0))
    trainer = Trainer(model, solver, params, state)
    opt = trainer.init(params, state)
    key = jax.random.key(1)
    carry = [params, state, opt]

    def run(x, y, i):
        p, s, o, loss, _, _ = trainer.step(*carry, [{"data": x, "label": y}], key, i)
        carry[:] = [p, s, o]
        return loss

    return run


def _conv(x, w, b):
    y = jax.lax.conv_general_dilated(
        x, w, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW")
    )
    return y + b[None, :, None, None]


def _pool(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def handwritten_step():
    """LeNet + SGD with momentum in plain JAX/optax (lr inside the history, as Caffe)."""
    k = jax.random.split(jax.random.key(0), 4)
    params = {
        "conv1": (jax.random.normal(k[0], (20, 1, 5, 5)) * 0.1, jnp.zeros(20)),
        "conv2": (jax.random.normal(k[1], (50, 20, 5, 5)) * 0.05, jnp.zeros(50)),
        "ip1": (jax.random.normal(k[2], (500, 800)) * 0.03, jnp.zeros(500)),
        "ip2": (jax.random.normal(k[3], (10, 500)) * 0.05, jnp.zeros(10)),
    }

    def loss_fn(p, x, y):
        h = _pool(_conv(x * 0.00390625, *p["conv1"]))
        h = _pool(_conv(h, *p["conv2"]))
        h = jax.nn.relu(h.reshape(x.shape[0], -1) @ p["ip1"][0].T + p["ip1"][1])
        logits = h @ p["ip2"][0].T + p["ip2"][1]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y.astype(jnp.int32)).mean()

    tx = optax.chain(optax.add_decayed_weights(5e-4), optax.trace(decay=0.9), optax.scale(-0.01))
    opt = tx.init(params)

    @jax.jit
    def step(p, o, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        updates, o = tx.update(g, o, p)
        return optax.apply_updates(p, updates), o, loss

    carry = [params, opt]

    def run(x, y, i):
        p, o, loss = step(*carry, x, y)
        carry[:] = [p, o]
        return loss

    return run


def torch_step():
    try:
        import torch
    except ImportError:
        return None
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 20, 5), torch.nn.MaxPool2d(2), torch.nn.Conv2d(20, 50, 5),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(800, 500), torch.nn.ReLU(),
        torch.nn.Linear(500, 10),
    )  # fmt: skip
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def run(x, y, i):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x * 0.00390625), y)
        loss.backward()
        opt.step()
        return loss

    run.torch = torch
    return run


def time_block(run, x, y) -> float:
    start = time.perf_counter()
    loss = None
    for i in range(STEPS):
        loss = run(x, y, i)
    if hasattr(loss, "block_until_ready"):
        loss.block_until_ready()
    return (time.perf_counter() - start) / STEPS * 1e3


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (BATCH, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, BATCH).astype(np.float32)
    runners = {"caffe2jax": caffe2jax_step(), "jax+optax (hand-written)": handwritten_step()}
    torch_run = torch_step()
    inputs = {name: (jnp.asarray(x), jnp.asarray(y)) for name in runners}
    if torch_run is not None:
        runners["pytorch eager"] = torch_run
        t = torch_run.torch
        inputs["pytorch eager"] = (t.from_numpy(x), t.from_numpy(y).long())
    times: dict[str, list[float]] = {name: [] for name in runners}
    for name, run in runners.items():  # compile and warm up
        time_block(run, *inputs[name])
    for _ in range(REPEATS):  # interleaved, so load changes hit every runner alike
        for name, run in runners.items():
            times[name].append(time_block(run, *inputs[name]))
    print(f"LeNet train step, batch {BATCH}, {platform.processor() or platform.machine()}, "
          f"{jax.devices()[0].device_kind}, jax {jax.__version__}")  # fmt: skip
    ours = statistics.median(times["caffe2jax"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:28s} {median:8.2f} ms/step   caffe2jax/this = {ours / median:5.2f}")
    if torch_run is None:
        print("  pytorch eager: not installed (pip install torch) — no ratio")


if __name__ == "__main__":
    main()
