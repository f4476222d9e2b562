"""The functional API: ``compile`` a prototxt into a :class:`Model` of pure JAX functions.

Caffe reshapes a net on every forward; a compiled program has fixed shapes. So a Model is one
member of a family, one per input shape signature (:meth:`Model.reshape`), built on first use
and kept (:class:`ShapeCache`, bounded); callers keep their compiled programs per member.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.pipeline import NetSource, load_net
from caffe2jax.lowering import python_class
from caffe2jax.lowering.engines import folding, packing
from caffe2jax.lowering.engines.policy import EnginePolicy
from caffe2jax.lowering.engines.precision import PRECISIONS, Precision
from caffe2jax.lowering.fillers import host_init
from caffe2jax.lowering.graph import Graph, Params
from caffe2jax.lowering.layers import vision
from caffe2jax.lowering.python_blobs import PythonLayerError, probe_ending
from caffe2jax.lowering.registry import type_problem
from caffe2jax.lowering.shape_cache import ShapeCache

__all__ = ["PRECISIONS", "EnginePolicy", "Model", "ShapeCache", "compile"]


class _Prefix(Graph):
    """A Graph whose shapes are inferred only for the layers up to index ``upto`` (inclusive)
    of ``net.layers``: Caffe's ForwardFromTo reshapes only the layers it runs, so layers after
    them may not fit the new shapes. Only ranges ending by ``upto`` may run."""

    def __init__(self, upto: int, *args: Any):
        self.upto = upto
        super().__init__(*args)

    def infer_shapes(self, net: ir.Net, given: dict[str, Sequence[int]]) -> dict:
        head = dataclasses.replace(net, layers=net.layers[: self.upto + 1])
        tops = {user for layer in head.layers for user in layer.top_names}
        return super().infer_shapes(head, {k: v for k, v in given.items() if k in tops})


class _Probe(_Prefix):
    """A Graph built up to class-style Python layer ``upto`` whose tops are provisional (its
    ``setup``/``reshape`` gave them; Caffe's layers after it take the shapes its ``forward``
    gives, reshaping just before they run). A run stops after that layer, whose forward runs
    and asks for the pass to run again (:func:`python_blobs.probe_ending`), the whole net
    then built at its tops' real shapes; until then the blobs after it read as zeros."""

    def __init__(self, upto: int, *args: Any):
        super().__init__(upto, *args)
        self.ends = self.net.layers[upto].name
        self.stop = 1 + next(k for k, c in enumerate(self.caffe_layers) if c.key == self.ends)

    def run(self, params, state, env, rng=None, *, start=0, stop=None, taps=None, keep=()):
        if start >= self.stop:
            raise NetError(
                f"layer '{self.caffe_layers[start].name}' runs at shapes that Python layer "
                f"'{self.ends}' gives in its forward: run the forward from before that layer"
            )
        stop = self.stop if stop is None else min(stop, self.stop)
        with probe_ending(self.ends):
            env, state = super().run(params, state, env, rng, start=start, stop=stop, taps=taps,
                                     keep=keep)  # fmt: skip
        for caffe in self.caffe_layers:
            for top in caffe.tops:
                env.setdefault(top, jnp.zeros((), self.dtype))
        return env, state


def _probe_end(net: ir.Net, err: NetError) -> str | None:
    """The last class-style Python layer before the layer ``err`` refused (a shape check)
    whose tops are provisional (:func:`python_class.provisional`): Caffe reshapes the layers
    after it only once its forward has run, so the net is built up to it first."""
    failed = getattr(err, "layer_name", None)
    names = [layer.name for layer in net.layers]
    if isinstance(err, PythonLayerError) or failed not in names:
        return None
    for layer in reversed(net.layers[: names.index(failed)]):
        if layer.type == "Python" and python_class.provisional(layer) is not None:
            return layer.name
    return None


def _build(args: tuple, upto: str | None, known_tops: Any, provisional: bool) -> Graph:
    """The Graph of ``args`` (net first) up to layer ``upto`` (None: all). ``provisional``: a
    layer refusing the shapes a Python layer's ``setup``/``reshape`` gave gets a
    :class:`_Probe` up to that layer instead (Caffe's Forward reshapes each layer just before
    it runs; Net::Init and Net::Reshape refuse such shapes, as here without it)."""
    names, probe = [layer.name for layer in args[0].layers], False
    while True:
        try:
            if upto is None:
                return Graph(*args, known_tops=known_tops)
            return (_Probe if probe else _Prefix)(names.index(upto), *args)
        except NetError as err:
            upto = _probe_end(args[0], err) if provisional else None
            if upto is None:
                raise
            probe = True


class Model:
    """A compiled Caffe net.

    ``net`` is the IR (with every blob's shape), ``inputs`` maps input blob names to shapes,
    ``outputs`` lists the blobs no layer consumes. ``init``, ``apply`` and ``loss`` are pure
    functions of their arguments, ready for ``jax.jit``, ``jax.grad`` and ``jax.vmap``.

    ``apply`` and ``loss`` are compiled programs: each is one ``jax.jit`` of the net, compiled on
    the first call per input signature (shapes, dtypes, whether an ``rng`` is given) and kept on
    the model, so a direct call runs at the compiled speed and returns what a caller's own
    ``jax.jit(model.apply)`` returns. Inside a caller's ``jit``/``grad``/``vmap`` the jitted call
    is traced into the caller's program (no second compile of its own). ``jax.disable_jit()``
    (or ``JAX_DISABLE_JIT=1``) runs them op by op, for debugging.

    ``precision`` (``"fp32"``, ``"tf32"`` or ``"bf16"``; default fp32, Caffe's; kept by every
    member of its family) is how the layers compute; params, state,
    gradients and returned blobs stay in ``dtype``. ``policy`` (an :class:`EnginePolicy`;
    default: :meth:`EnginePolicy.from_env`, the environment switches read now) picks the engine
    of each convolution and pooling and whether the internal NHWC pass runs; ``channels_last``
    overrides the latter. Blobs and params keep Caffe's layout either way.
    """

    def __init__(
        self,
        net: ir.Net,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        dtype: Any = jnp.float32,
        precision: str | Precision | None = None,
        channels_last: bool | None = None,
        policy: EnginePolicy | None = None,
        *,
        upto: str | None = None,
        known_tops: Mapping[str, Sequence[tuple[int, ...]]] | None = None,
        provisional: bool = False,
    ):
        """``upto`` (a layer name): infer shapes only for the layers up to that one (see
        :meth:`reshape`). ``known_tops``: each layer's top shapes from an identical earlier
        build (a start-up cache's; see :class:`Graph`). ``provisional``: see :meth:`reshape`."""
        args = (net, input_shapes, dtype, precision, channels_last, policy)
        self.graph = _build(args, upto, known_tops, provisional)
        # a probe's Python layer (its tops provisional until its forward has run)
        self.probe = self.graph.ends if isinstance(self.graph, _Probe) else None
        self.upto = upto if self.probe is None else self.probe
        self._pending = None
        if self.probe is not None:
            self._pending = python_class.provisional(self.graph.layer_by_name[self.probe])
        # the shapes its class-style Python layers' tops had when it was built (a forward may
        # reshape them: then a member of the same input shapes is built for the new ones)
        self._python_tops = python_class.built_tops(self.graph.net)
        self._family: ShapeCache | None = None
        self._compiled: dict[str, Any] = {}
        # compiled programs callers keep for this member (dropped with it from the family)
        self.programs: dict[Hashable, Any] = {}

    @property
    def net(self) -> ir.Net:
        return self.graph.net

    @property
    def inputs(self) -> dict[str, tuple[int, ...]]:
        return dict(self.graph.inputs)

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.graph.net.outputs

    @property
    def dtype(self) -> Any:
        return self.graph.dtype

    @property
    def precision(self) -> str:
        return self.graph.precision.name

    @property
    def policy(self) -> EnginePolicy:
        return self.graph.policy

    def init(self, key: jax.Array | int = 0) -> tuple[Params, Params]:
        """Params and state drawn from each blob's Caffe filler. Called with a concrete key
        the fillers run on the host (:func:`host_init` below: nothing to compile,
        samples from NumPy's generator seeded by the key); traced (inside ``jit``/``vmap``),
        as one JAX program drawing from the key itself. Same distributions, other samples;
        each path is deterministic in its key."""
        if isinstance(key, int):
            key = jax.random.key(key)
        if isinstance(key, jax.core.Tracer):
            return self.graph.init(key)
        return host_init(self.graph, key)

    def apply(
        self,
        params: Params,
        state: Params,
        inputs: Mapping[str, Any],
        rng: jax.Array | None = None,
    ) -> tuple[dict[str, jax.Array], Params]:
        """Forward: every blob (user names for final versions) and the updated state, as one
        compiled program (see the class docstring)."""
        return self._program("apply")(params, state, _host_arrays(inputs), rng)

    def packed(self, params: Params, state: Params | None = None) -> Params:
        """``params`` for :meth:`apply` on inputs of these shapes with each oneDNN
        convolution's weights packed once into oneDNN's format (lowering/engines/packing.py;
        ONNX Runtime's pre-packed initializers) and, given ``state``, each in-place
        Convolution → BatchNorm → Scale chain folded into the convolution (folding.py). Forward
        only, for a run of the whole net: a packed tree has no gradient. Redone whenever an
        array object changes; packing alone leaves the forward bit for bit. Each step is off
        under a policy without ``packed_weights`` / ``fold_batchnorm`` (``onednn_post_ops``:
        a chain's bias and ReLU inside its oneDNN call, fused.py)."""
        if "packer" not in self.programs:
            keys = vision.onednn_keys(self.graph) if self.policy.packed_weights else {}
            found = folding.chains(self.net, self.graph.shared) if self.policy.fold_batchnorm \
                and not self.graph.precision.casts else []  # fmt: skip
            packer = packing.Packer(keys, self.policy.onednn_post_ops, self.policy.winograd)
            self.programs["packer"] = (packer, folding.Folder(self.net, found))
        packer, folder = self.programs["packer"]
        return packer(params if state is None else folder(params, state))

    def loss(
        self,
        params: Params,
        state: Params,
        inputs: Mapping[str, Any],
        rng: jax.Array | None = None,
    ) -> tuple[jax.Array, tuple[dict[str, jax.Array], Params]]:
        """Caffe's net objective and ``(blobs, state)``: use with value_and_grad(has_aux=True).
        One compiled program, as :meth:`apply`; ``jax.grad`` of it compiles the backward too."""
        return self._program("loss")(params, state, _host_arrays(inputs), rng)

    def loss_in_pass(self, index: int) -> Callable:
        """:meth:`loss` for pass ``index`` of a Caffe iteration (its iter_size passes), traced
        inside :func:`python_class.in_pass`: with class-style Python layers each pass gets its
        own program (JAX would reuse one trace, and with it pass 0's top shapes)."""
        if index == 0 or not self.runs_python_layers:
            return self.loss
        return self._program(f"loss#{index}")

    def _program(self, name: str) -> Any:
        """The jitted forward (``apply``) or objective (``loss``) of this member, built once."""
        if name not in self._compiled:
            graph = self.graph

            def loss(params, state, inputs, rng):
                blobs, state = graph.apply(params, state, inputs, rng)
                return graph.objective(blobs), (blobs, state)

            self._compiled[name] = jax.jit(graph.apply if name == "apply" else loss)
        return self._compiled[name]

    def reshape(self, input_shapes: Mapping[str, Sequence[int]], *, upto: str | None = None,
                provisional: bool = False) -> Model:  # fmt: skip
        """The same net for other input shapes (Caffe's Net::Reshape; params must still fit),
        one per signature, built once and kept with this model's family (:class:`ShapeCache`).
        ``upto`` (a layer name) infers shapes only for the layers up to that one, as Caffe's
        ``ForwardFromTo(…, upto)`` reshapes only the layers it runs.

        ``provisional`` (for a forward, as Caffe's Forward reshapes each layer just before it
        runs): where a layer refuses the tops a class-style Python layer's ``setup``/``reshape``
        gave (py-faster-rcnn's anchor target layer gives the real ones only in ``forward``),
        the model returned is a probe (:attr:`probe` names that layer; not kept): its programs
        run up to that layer, whose forward then has the pass run again (:func:`retrace`) with
        the model of the real shapes."""
        shapes = {**self.inputs, **{k: tuple(int(d) for d in v) for k, v in input_shapes.items()}}
        key = (tuple(sorted(shapes.items())), upto)
        family = self.family()
        found = family.find(lambda sig, model: sig[:2] == key and model.is_current())
        if found is None:
            found = self._member(shapes, upto, provisional)
            if found.probe is None:
                family.get(found.signature, lambda: found)
        return found

    @property
    def runs_python_layers(self) -> bool:
        """Whether class-style Python layers run in its programs: a forward of theirs may
        reshape their tops, and the pass then runs again, so its inputs must stay alive (a
        caller donates no buffer to such a program)."""
        return bool(self._python_tops)

    def is_current(self) -> bool:
        """Whether its Python layers' tops still have the shapes it was built for (a Python
        layer may reshape its tops in ``forward``, as in Caffe: then :meth:`reshape` with the
        same input shapes gives the member for the new ones)."""
        pending = self._pending
        return python_class.is_current(self._python_tops) and (
            pending is None or not python_class.forward_ran(pending)
        )

    def family(self) -> ShapeCache:
        """The models of this net by shape signature (this one included)."""
        if self._family is None:
            self._family = ShapeCache(f"net '{self.net.name}'")
            self._family.put(self.signature, self)
        return self._family

    def _member(self, shapes: Mapping[str, tuple[int, ...]], upto: str | None,
                provisional: bool = False) -> Model:  # fmt: skip
        model = Model(self.graph.net, shapes, self.dtype, self.graph.precision,
                      None, self.graph.policy, upto=upto, provisional=provisional)  # fmt: skip
        model.join(self.family())
        return model

    def join(self, family: ShapeCache) -> None:
        """Make this model a member of ``family``: its own reshapes are kept there too."""
        self._family = family

    @property
    def signature(self) -> Hashable:
        """The input shapes this model was built for, ``upto``, and its Python layers' top
        shapes (the key of its family)."""
        tops = tuple((bound.name, bottoms, tops) for bound, bottoms, tops in self._python_tops)
        return tuple(sorted(self.inputs.items())), self.upto, tops


def _host_arrays(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``inputs`` with every value an array (a nested list or a Python scalar becomes one NumPy
    array, as :meth:`Graph.feed` would make it, instead of a pytree of scalars under jit)."""
    return {
        name: value if isinstance(value, (jax.Array, np.ndarray)) else np.asarray(value)
        for name, value in inputs.items()
    }


def compile(  # noqa: A001 - the design card's name for it
    source: NetSource,
    phase: str = ir.TEST,
    level: int = 0,
    stages: Iterable[str] = (),
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dtype: Any = jnp.float32,
    precision: str | None = None,
    policy: EnginePolicy | None = None,
    dialect: str | None = None,
) -> Model:
    """Compile a net prototxt (path, text, bytes or NetParameter) for a phase/level/stages,
    computing in ``precision`` with the engines ``policy`` picks (see :class:`Model`);
    ``dialect``: a fork's numbering, or the path of a fork's caffe.proto (docs/forks.md)."""
    net = load_net(source, phase, level, stages, layer_types=type_problem, dialect=dialect)
    return Model(net, input_shapes, dtype, precision, policy=policy)
