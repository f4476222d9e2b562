"""Caffe's multi-GPU training (P2PSync / NCCL) as one XLA program over a device mesh.

Caffe runs one solver per GPU: each runs its own ``batch_size`` through its own net, the
param diffs are summed over the GPUs and scaled by 1/solver_count, and every solver applies
the same update, so the update equals one GPU running solver_count × batch_size. Everything
else stays per GPU: a BatchNorm layer computes its batch statistics, and its running
averages, from its own GPU's samples only (nothing reduces those blobs), and the root solver
(rank 0) is the one that tests, displays its own loss and snapshots its own net.

Here the step is ``shard_map`` over the mesh's data axis: each device runs the iter_size
passes on its slice, ``pmean`` reduces the gradients inside the program, and the update runs
replicated. The state carried on (BatchNorm statistics) and the loss and outputs shown are
device 0's, which is what Caffe's root solver holds, shows and snapshots; the other devices'
running averages are never observable in Caffe (TRAIN uses batch statistics), so they are
not kept. Device ``k`` draws its random numbers from the pass key folded with ``k`` (device 0
uses the pass key itself), as Caffe seeds solver ``k`` with ``random_seed + k``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from caffe2jax.frontend.errors import SolverError
from caffe2jax.lowering.registry import carry_of
from caffe2jax.runtime.data.prefetch import Prefetcher
from caffe2jax.runtime.data.shards import ReadPlan, check_turn, follow, period_plan
from caffe2jax.runtime.parallel.devices import (
    DATA,
    is_primary,
    local_slots,
    replicate,
    replicated,
    sharded,
)


def first(tree: Any) -> Any:
    """Device 0's value of ``tree`` on every device (inside the mesh program)."""
    mine = lax.axis_index(DATA) == 0
    return jax.tree.map(lambda x: lax.psum(jnp.where(mine, x, jnp.zeros_like(x)), DATA), tree)


def device_key(rng: jax.Array) -> jax.Array:
    """The pass key on device 0, the key folded with the device's index elsewhere."""
    index = lax.axis_index(DATA)
    data = jnp.where(index == 0, jax.random.key_data(rng),
                     jax.random.key_data(jax.random.fold_in(rng, index)))  # fmt: skip
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(rng))


def sharded_step(trainer: Any, mesh: Mesh) -> Callable:
    """The trainer's step over ``mesh``: same signature and results as the one-device step
    (:meth:`caffe2jax.runtime.train.step.Trainer._make_step`), passes sharded along the batch."""
    passes_fn, iter_size = trainer.make_passes(), trainer.iter_size

    def local(params, state, passes, rng):
        grads, state, losses, out, last_in = passes_fn(params, state, passes, device_key(rng))
        # NCCL::on_gradients_ready: sum over the solvers, scaled by 1 / solver_count
        grads = lax.pmean(grads, DATA)
        return grads, first(state), first(jnp.mean(losses)), first(out), first(last_in)

    body = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(DATA), P()), out_specs=P(),
                         check_vma=False)  # fmt: skip

    def step(params, state, opt_state, passes, key, iteration):
        trainer.traces += 1
        rng = jax.random.fold_in(key, iteration)
        grads, state, loss, out, last_in = body(params, state, passes, rng)
        params, opt_state, diffs = trainer.update_of(params, state, opt_state, grads)
        extra = (diffs, last_in) if iter_size > 1 else (diffs,)
        return params, state, opt_state, loss, out, extra

    return step


def test_forward(model: Any, mesh: Mesh) -> Callable:
    """A test net's forward over ``mesh``: one batch per device. Returns the blobs stacked
    by device (sharded), each device's output values and objective gathered on every
    device, and device 0's state."""
    graph = model.graph

    def local(params, state, inputs, rngs):
        blobs, state = model.apply(params, state, inputs, rngs[0])
        outputs = {name: blobs[name] for name in model.outputs}
        gathered = lax.all_gather((outputs, graph.objective(blobs)), DATA)
        return jax.tree.map(lambda x: x[None], blobs), gathered, first(state)

    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(DATA), P(DATA)),
                                 out_specs=(P(DATA), P(), P()), check_vma=False))  # fmt: skip


def assemble(slices: Sequence[Mapping[str, Any]], mesh: Mesh) -> dict[str, jax.Array]:
    """One global batch from this process's per-device batches (in mesh order): the devices'
    slices form one array sharded on its rows. A slice the prefetch thread already put on
    its device is used as it is; host arrays (MemoryData) are copied to theirs here."""
    devices = [mesh.devices.flat[i] for i in local_slots(mesh)]
    out = {}
    for name in slices[0]:
        parts = [_on(s[name], d) for s, d in zip(slices, devices, strict=True)]
        shape = (parts[0].shape[0] * mesh.size, *parts[0].shape[1:])
        out[name] = jax.make_array_from_single_device_arrays(shape, sharded(mesh), parts)
    return out


def _on(x: Any, device: jax.Device) -> jax.Array:
    if isinstance(x, jax.Array) and x.devices() == {device}:
        return x
    return jax.device_put(x, device)


def shard_keys(keys: Sequence[jax.Array], mesh: Mesh) -> jax.Array:
    """One PRNG key per device (the same list on every process), sharded on the data axis."""
    impl = jax.random.key_impl(keys[0])
    data = np.stack([np.asarray(jax.random.key_data(k)) for k in keys])
    array = jax.make_array_from_callback(data.shape, sharded(mesh), lambda i: data[i])
    return jax.random.wrap_key_data(array, impl=impl)


def plan_of(batches: int, mesh: Mesh) -> ReadPlan:
    """This process's reading of ``batches`` batches in rounds of one batch per device: a
    train iteration's round (``batches`` = devices) or a test pass (``test_iter``)."""
    return period_plan(batches, mesh.size, local_slots(mesh), tuple(mesh.devices.flat))


def read_round(feeder: Any, plan: ReadPlan, start: int, count: int, mesh: Mesh) -> list[dict]:
    """This process's per-device batches for the round of ``count`` real batches at
    ``start`` in ``plan`` (``count`` ≤ devices; missing ones repeat the last batch). Batches
    of other processes' devices are skipped undecoded (Caffe's ``DataLayer::Skip``), so each
    record is read once, by the process whose device trains on it; each device's batches are
    those it gets when one process reads them all."""
    slots = local_slots(mesh)
    kept: dict[int, dict] = {slot: {} for slot in slots}
    for name, source in feeder.sources.items():
        tops = feeder.layers[name].top_names
        if isinstance(source, Prefetcher):
            source.shard(plan)
            pairs = _prefetched(name, source, plan, start, count)
        else:
            pairs = follow(source, plan, start, start + count)
        pad = getattr(source, "pad_to", None)  # the declared shapes: one program, every device
        for slot, batch in pairs:
            batch = batch if pad is None else pad(batch, source.top_shapes())
            kept[slot].update(zip(tops, batch, strict=True))
    return [kept[slot] for slot in slots]


def _prefetched(name: str, source: Prefetcher, plan: ReadPlan, start: int,
                count: int) -> Iterator[tuple[int, Any]]:  # fmt: skip
    """The round's batches from a prefetch thread following ``plan``, each checked to be
    the one due for its slot."""
    for position in range(start, start + count):
        for slot in plan.targets[position]:
            tag, batch = source.next_slot()
            check_turn(name, tag, (position, slot))
            yield slot, batch


def shard_feeders(loop: Any) -> None:
    """Every prefetching data layer reads by its plan from the start: the train net one
    round per iteration, each test net its ``test_iter`` batches per pass."""
    periods = [(loop.train, loop.mesh.size)]
    periods += [(net, loop.param.test_iter[i]) for i, net in enumerate(loop.tests)]
    for net, batches in periods:
        if batches < 1:
            continue
        plan = plan_of(batches, loop.mesh)
        for source in net.feeder.sources.values():
            if isinstance(source, Prefetcher):
                source.shard(plan)


class FirstSlice(Mapping):
    """Device 0's rows of global input arrays, replicated on the mesh when read (what Caffe's
    root solver net shows); reading costs nothing until a pycaffe view asks."""

    def __init__(self, inputs: Mapping[str, jax.Array], mesh: Mesh):
        self._inputs, self._mesh = inputs, mesh

    def __getitem__(self, name: str) -> jax.Array:
        array = self._inputs[name]
        device = self._mesh.devices.flat[0]
        shard = next(s.data for s in array.addressable_shards if s.device == device)
        return jax.device_put(shard, replicated(self._mesh))

    def __iter__(self) -> Iterator[str]:
        return iter(self._inputs)

    def __len__(self) -> int:
        return len(self._inputs)


class Slot(Mapping):
    """One device's blobs out of blobs stacked by device (a test net's last forward)."""

    def __init__(self, stacked: Mapping[str, jax.Array], slot: int):
        self._stacked, self._slot = stacked, slot

    def __getitem__(self, name: str) -> np.ndarray:
        return np.asarray(self._stacked[name][self._slot])

    def __iter__(self) -> Iterator[str]:
        return iter(self._stacked)

    def __len__(self) -> int:
        return len(self._stacked)


def check_loop(loop: Any) -> None:
    """What data-parallel training supports: nets fed by data layers, no values carried
    between iterations; on processes other than 0, no snapshots (Caffe's root solver
    alone snapshots). Then the data layers start reading by their plans."""
    for net in [loop.train, *loop.tests]:
        unfed = set(net.model.inputs) - set(net.feeder.input_shapes())
        if unfed:
            raise SolverError(
                f"net '{net.model.net.name}': Input blobs ({', '.join(sorted(unfed))}) "
                "cannot be split over devices; multi-device training needs data layers "
                "(Data, ImageData, HDF5Data, MemoryData, WindowData)"
            )
        carried = list(carry_of(net.model.init(jax.random.key(0))[1]))
        if carried:
            raise SolverError(
                f"net '{net.model.net.name}': recurrent values carried between "
                f"iterations ({', '.join(carried)}) train on one device only"
            )
    if not is_primary():
        loop.param.snapshot = 0
        loop.param.snapshot_after_train = False
    shard_feeders(loop)


def test_on_mesh(loop: Any, index: int, params: dict, state: dict,
                 forward: Callable) -> dict[str, float]:  # fmt: skip
    """Solver::Test on the mesh with ``forward`` (:func:`test_forward` of the test net):
    the same test_iter batches, in the same order, with the same keys as on one device, one
    per device at a time; the last round is padded with repeats that count for nothing.
    Scores equal the one-device test."""
    net, n = loop.tests[index], loop.mesh.size
    iters = loop.param.test_iter[index]
    params, state = loop.trainer.place(params, state)
    sums: dict[str, Any] = {}
    loss, done, blobs, count = 0.0, 0, None, 0
    plan = plan_of(iters, loop.mesh)
    while done < iters:
        count = min(n, iters - done)
        fed = read_round(net.feeder, plan, done, count, loop.mesh)
        keys = []
        for _ in range(count):
            net.key, rng = jax.random.split(net.key)
            keys.append(rng)
        keys += keys[-1:] * (n - count)
        blobs, (outputs, objective), _ = forward(
            params, state, assemble(fed, loop.mesh),
            shard_keys(keys, loop.mesh))  # fmt: skip
        if net.sinks.layers:
            for slot in range(count):
                net.sinks.write(Slot(blobs, slot))
        if loop.param.test_compute_loss:
            loss += float(np.sum(np.asarray(objective, np.float64)[:count]))
        for name in net.model.outputs:
            value = np.asarray(outputs[name], np.float64)[:count]
            sums[name] = sums.get(name, 0) + np.sum(value, axis=0)
        done += count
    loop.last_test_env[index] = Slot(blobs, count - 1)
    loop.tests_run += 1
    if loop.param.test_compute_loss:
        loop.log.info(f"Test loss: {loss / iters:.6g}")
    return loop.log_outputs("Test", net.model, {k: v / iters for k, v in sums.items()})


__all__ = ["FirstSlice", "Slot", "assemble", "check_loop", "first", "plan_of", "read_round",
           "replicate", "shard_feeders", "shard_keys", "sharded_step", "test_forward",
           "test_on_mesh"]  # fmt: skip
