"""The layer registry: one lowering per Caffe type string, exactly as Caffe spells it, and per
fork form of it.

A lowering is a pure function ``fn(layer, params, bottoms, ctx) -> tops`` plus the shapes and
fillers of its param blobs in Caffe's blob order::

    @register("InnerProduct", counts=(1, 1, 1, 1))
    def inner_product(layer, params, bottoms, ctx):
        ...

    @inner_product.param_shapes
    def _(layer, bottom_shapes):
        return [ParamDecl((n, k), p.weight_filler), ...]

``params`` is the layer's full blob list in Caffe's order (learnable blobs and state blobs,
shared blobs resolved). A ``stateful`` lowering returns ``(tops, new_state)`` where
``new_state`` lists new values for its state blobs in order. A ``source`` lowering (Input,
MemoryData, Data…) computes nothing: its tops are graph inputs, and its function returns the
shapes it declares (``None`` where only the data can tell).

A type string that names different layers in Caffe's forks (frontend/forks/forms.py decides
each layer's ``form``) registers each variant under a key that carries it:
``@register("SoftmaxWithLoss", form="segnet")`` in the fork's module beside BVLC's
``@register("SoftmaxWithLoss")``; :func:`lookup` takes the layer's (type, form) entry where
there is one, else the type's BVLC entry (form ``""``), so no lowering reads ``layer.form``.
An entry also says whether the type computes in bfloat16 under precision ``bf16``
(``bf16=True``, lowering/engines/precision.py), for a data layer how it is fed (``feed=``:
:data:`DATA_LAYERS`; the runtime registers its reader under the same type string), and may
add a channels-last form (``@convolution.nhwc(when=..., starts=True)``: lowering/layout.py)
and an engine rule (``@convolution.engine``, read as ``ctx.engine``). docs/layers.md lists all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.forks.layer_types import unsupported_fork_type
from caffe2jax.frontend.layer_text import misspelt_type
from caffe2jax.lowering.engines.policy import EnginePolicy

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ParamDecl:
    """One param blob: its shape, its FillerParameter (None: zeros), and whether it is state.

    State blobs (BatchNorm's mean, variance and scale factor) are written by the forward
    pass, not by the solver; they live in the ``state`` pytree instead of ``params``.
    """

    shape: Shape
    filler: Any = None
    state: bool = False


@dataclass
class Context:
    """What a lowering may know besides its inputs: phase, randomness, dtype, its engine."""

    phase: str
    rng: jax.Array | None
    dtype: Any = jnp.float32
    layer_name: str = ""
    layer_index: int = 0
    carry: list[jax.Array] = field(default_factory=list)
    # the form the engine policy chose for this layer when the graph was planned (the value
    # its ``@<lowering>.engine`` rule returned; None: the plain form, e.g. in shape inference)
    engine: Any = None

    @property
    def train(self) -> bool:
        return self.phase == ir.TRAIN

    def key(self) -> jax.Array:
        """This layer's PRNG key (the net's rng folded with the layer's index, derived only
        when a layer asks for it); a clear error when the caller gave no rng."""
        if self.rng is None:
            raise NetError(
                f"layer '{self.layer_name}' draws random numbers in phase {self.phase}: "
                "pass rng=jax.random.key(...) to apply()"
            )
        return jax.random.fold_in(self.rng, self.layer_index)


@dataclass(frozen=True)
class Planning:
    """What a layer's engine rule may depend on, all known when the graph is planned: the net's
    engine policy, the dtype the layer computes in, whether it runs channels-last, and the Caffe
    type of the layer that computed each bottom (through split layers; "Input" and the other
    source types for net inputs)."""

    policy: EnginePolicy
    dtype: Any
    channels_last: bool
    producers: tuple[str, ...]


LoweringFn = Callable[[ir.Layer, Sequence[jax.Array], Sequence[jax.Array], Context], Any]
ParamShapesFn = Callable[[ir.Layer, Sequence[Shape]], list[ParamDecl]]
ShapesRule = Callable[[ir.Layer, Sequence[Shape]], bool]
EngineFn = Callable[[ir.Layer, Sequence[Shape], Planning], Any]


@dataclass(frozen=True)
class DataLayer:
    """One of Caffe's data layer types as the whole pipeline sees it: the blob counts Caffe
    checks and who fills its tops.

    ``feed``: ``"caller"`` (Input: the user's arrays), ``"memory"`` (MemoryData's arrays given
    to ``set_input_arrays``), ``"pipeline"`` (read from files by ``caffe2jax.runtime.data``) or
    ``"sink"`` (HDF5Output: written after each forward). The runtime registers the class that
    reads (or writes) each type's data under the same type string (``runtime/data/readers/``),
    so lowering names no runtime class.
    """

    counts: tuple[int, int | None, int, int | None]
    feed: str


@dataclass
class Lowering:
    """A registered Caffe layer type (in one fork form: ``form``, ``""`` for BVLC's)."""

    type: str
    fn: LoweringFn
    stateful: bool = False
    source: bool = False
    no_force_backward: tuple[int, ...] = ()
    counts: tuple[int, int | None, int, int | None] | None = None
    equal_bottom_top: bool = False
    _param_shapes: ParamShapesFn | None = None
    _carry_shapes: ParamShapesFn | None = None
    nhwc_fn: LoweringFn | None = None
    nhwc_when: ShapesRule | None = None
    nhwc_starts: bool = False
    _engine: EngineFn | None = None
    form: str = ""
    # computes in bfloat16 under precision "bf16" (lowering/engines/precision.py)
    bf16: bool = False
    data: DataLayer | None = None

    def __call__(self, layer, params, bottoms, ctx):
        return self.fn(layer, params, bottoms, ctx)

    def param_shapes(self, fn: ParamShapesFn) -> ParamShapesFn:
        """Decorator: declare the layer's param blobs from its bottom shapes."""
        self._param_shapes = fn
        return fn

    def carry_shapes(self, fn: ParamShapesFn) -> ParamShapesFn:
        """Decorator: declare values the layer carries from one forward to the next (Caffe's
        RecurrentLayer copies its last hidden state into the next forward's first). They are
        not Caffe blobs: kept in ``state.carry`` (:class:`NetState`), never in weight files. The
        lowering reads ``ctx.carry`` and returns ``(tops, new_carry)``."""
        self._carry_shapes = fn
        return fn

    def nhwc(self, fn: LoweringFn | None = None, *, when: ShapesRule | None = None,
             starts: bool = False):  # fmt: skip
        """Register the layer's channels-last form (lowering/layout.py): ``fn(layer, params,
        bottoms, ctx)`` on (N, H, W, C) bottoms, returning (N, H, W, C) tops, taken where
        ``when(layer, bottom_shapes)`` holds for the (Caffe-layout, 4-D) bottom shapes. A layer
        that ``starts`` a channels-last chain takes it wherever eligible (Convolution); the others
        only when they read a blob a channels-last layer wrote. A decorator, or called with the
        layer's own function for layers that act element by element in any layout."""

        def wrap(form: LoweringFn) -> LoweringFn:
            if self.nhwc_fn is not None:
                raise ValueError(f"layer type {self.type!r} has two channels-last forms")
            self.nhwc_fn, self.nhwc_when, self.nhwc_starts = form, when, starts
            return form

        return wrap if fn is None else wrap(fn)

    def has_nhwc(self, layer: ir.Layer, bottom_shapes: Sequence[Shape]) -> bool:
        """Whether ``layer`` has a channels-last form for these (Caffe-layout) bottom shapes."""
        if self.nhwc_fn is None or not bottom_shapes:
            return False
        if any(len(s) != 4 for s in bottom_shapes):
            return False
        return self.nhwc_when is None or bool(self.nhwc_when(layer, bottom_shapes))

    def engine(self, fn: EngineFn) -> EngineFn:
        """Decorator: the rule choosing this layer's form from the engine policy when the graph
        is planned, ``fn(layer, bottom_shapes, planning) -> choice``; the lowering reads the
        choice as ``ctx.engine``."""
        self._engine = fn
        return fn

    @property
    def has_engine(self) -> bool:
        """Whether the type has an engine rule (``@<lowering>.engine``)."""
        return self._engine is not None

    def choose_engine(self, layer: ir.Layer, bottom_shapes: Sequence[Shape], planning: Planning):
        """The layer's engine choice (None for types with no engine rule)."""
        return None if self._engine is None else self._engine(layer, bottom_shapes, planning)

    def declare_carry(self, layer: ir.Layer, bottom_shapes: Sequence[Shape]) -> list[ParamDecl]:
        if self._carry_shapes is None:
            return []
        return list(self._carry_shapes(layer, bottom_shapes))

    def declare(self, layer: ir.Layer, bottom_shapes: Sequence[Shape]) -> list[ParamDecl]:
        if self._param_shapes is None:
            return []
        return list(self._param_shapes(layer, bottom_shapes))

    def check_counts(self, n_bottoms: int, n_tops: int) -> str | None:
        """Caffe's Layer::CheckBlobCounts: None when the counts fit, else what the type
        accepts. Types whose counts depend on their parameters (RNN, LSTM, Python) declare
        none and check in their lowering."""
        if self.counts is None:
            return None
        lo_b, hi_b, lo_t, hi_t = self.counts
        if n_bottoms < lo_b or (hi_b is not None and n_bottoms > hi_b):
            return f"takes {_range(lo_b, hi_b)} bottom blob(s), got {n_bottoms}"
        if n_tops < lo_t or (hi_t is not None and n_tops > hi_t):
            return f"produces {_range(lo_t, hi_t)} top blob(s), got {n_tops}"
        if self.equal_bottom_top and n_bottoms != n_tops:
            return f"needs as many tops as bottoms, got {n_bottoms} bottom(s) and {n_tops} top(s)"
        return None

    def allow_force_backward(self, n_bottoms: int) -> tuple[bool, ...]:
        """Caffe's AllowForceBackward per bottom (loss layers refuse their labels)."""
        return tuple(i not in self.no_force_backward for i in range(n_bottoms))


_REGISTRY: dict[tuple[str, str], Lowering] = {}


class NetState(dict):
    """A net's ``state``: Caffe's state blobs by layer name, as a dict (BatchNorm's mean,
    variance and scale factor: ``state["bn"]``), and in its own tree ``carry`` the values a
    layer carries from one forward to the next (RNN/LSTM's h_T, c_T), which are not Caffe blobs
    and never go into weight files. A pytree: ``jit``/``grad``/``tree.map`` see both."""

    def __init__(self, blobs=(), carry=None):
        super().__init__(blobs)
        self.carry: dict[str, list] = dict(carry or {})

    def __repr__(self) -> str:
        return f"NetState({dict.__repr__(self)}, carry={self.carry!r})"


def carry_of(state: object) -> dict[str, list]:
    """The carried values of ``state`` (none for a plain dict)."""
    return getattr(state, "carry", {})


jax.tree_util.register_pytree_node(
    NetState,
    lambda s: ((dict(s), s.carry), None),
    lambda _, children: NetState(children[0], children[1]),
)


def _range(lo: int, hi: int | None) -> str:
    if hi == lo:
        return f"exactly {lo}"
    return f"at least {lo}" if hi is None else f"{lo} to {hi}"


def register(
    type_name: str,
    *,
    form: str = "",
    counts: tuple[int, int | None, int, int | None] | None = None,
    equal_bottom_top: bool = False,
    stateful: bool = False,
    source: bool = False,
    no_force_backward: Sequence[int] = (),
    bf16: bool = False,
    feed: str | None = None,
) -> Callable[[LoweringFn], Lowering]:
    """Register the lowering of Caffe type ``type_name`` in fork form ``form`` (``""``: BVLC's,
    or a fork type's one meaning), once per (type, form); ``bf16``: computes in bfloat16 under
    precision ``bf16``; ``feed``: a data layer (:class:`DataLayer`)."""

    def wrap(fn: LoweringFn) -> Lowering:
        if (type_name, form) in _REGISTRY:
            variant = f" in form {form!r}" if form else ""
            raise ValueError(f"layer type {type_name!r}{variant} is registered twice")
        data = None if feed is None else DataLayer(counts or (0, None, 0, None), feed)
        lowering = Lowering(type_name, fn, stateful, source, tuple(no_force_backward), counts,
                            equal_bottom_top, form=form, bf16=bf16, data=data)  # fmt: skip
        _REGISTRY[(type_name, form)] = lowering
        return lowering

    return wrap


def unregister(type_name: str, form: str = "", restore: Lowering | None = None) -> Lowering | None:
    """Drop an entry and return it, ``restore`` in its place if given (a user's layer registered
    anew, or over a built-in one and dropped again: lowering/forks/user.py)."""
    found = _REGISTRY.pop((type_name, form), None)
    _REGISTRY.update({} if restore is None else {(type_name, form): restore})
    return found


def registered_types() -> list[str]:
    """Every Caffe type string caffe2jax lowers, sorted."""
    load_families()
    return sorted({type_name for type_name, _ in _REGISTRY})


def registered_forms() -> list[tuple[str, str]]:
    """Every registered (type, form), sorted (form ``""``: BVLC's, or a fork type's one)."""
    load_families()
    return sorted(_REGISTRY)


def lowering_of(type_name: str, form: str = "") -> Lowering:
    """The lowering a layer of ``type_name`` in ``form`` runs: its (type, form) entry, else the
    type's entry of form ``""``, else (a fork type with forms only) its first form's; KeyError
    if the type is not registered."""
    load_families()
    found = _REGISTRY.get((type_name, form)) or _REGISTRY.get((type_name, ""))
    if found is None:
        forms = sorted(f for t, f in _REGISTRY if t == type_name)
        if not forms:
            raise KeyError(type_name)
        found = _REGISTRY[(type_name, forms[0])]
    return found


def type_problem(layer_type: str, form: str = "") -> str | None:
    """What to say of a layer type in fork form ``form`` that caffe2jax does not lower (None: it
    lowers it): a form of a registered type without its own entry, the fork the type comes from,
    else that it is unsupported (with a close type name, if any)."""
    load_families()
    if (layer_type, form) in _REGISTRY or (layer_type, "") in _REGISTRY:
        return None
    forms = sorted(f for t, f in _REGISTRY if t == layer_type)
    if forms:
        return f"form '{form}' has no lowering; the type's forms: {', '.join(forms)}"
    fork = unsupported_fork_type(layer_type, form)
    if fork:
        return fork
    types = registered_types()
    close = misspelt_type(layer_type, list(types))
    hint = f" (did you mean '{close}'?)" if close else ""
    return (f"unsupported type '{layer_type[:40]}'{hint}; {len(types)} types are supported "
            "(caffe2jax.layer_type_list()); register it: caffe2jax.register_layer, "
            "--layers MODULE")  # fmt: skip


def lookup(layer: ir.Layer) -> Lowering:
    """The lowering for ``layer``: its (type, form) entry where its form has one, else the
    type's BVLC entry; an unknown type fails naming the layer and the known types."""
    form = getattr(layer, "form", "")
    problem = type_problem(layer.type, form)
    if problem is None:
        return _REGISTRY.get((layer.type, form)) or _REGISTRY[(layer.type, "")]
    if problem.startswith("unsupported type"):
        raise NetError(f"layer '{layer.name}' has {problem}")
    raise NetError(f"layer '{layer.name}' (type {layer.type}): {problem}")


class _DataLayers(Mapping[str, DataLayer]):
    """The data layer types as registered (type -> :class:`DataLayer`, the first form's)."""

    def _table(self) -> dict[str, DataLayer]:
        load_families()
        table: dict[str, DataLayer] = {}
        for (type_name, _), lowering in _REGISTRY.items():
            if lowering.data is not None:
                table.setdefault(type_name, lowering.data)
        return table

    def __getitem__(self, type_name: str) -> DataLayer:
        return self._table()[type_name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


DATA_LAYERS: Mapping[str, DataLayer] = _DataLayers()


def data_layers(feed: str) -> tuple[str, ...]:
    """The data layer types fed as ``feed`` says (see :class:`DataLayer`)."""
    return tuple(name for name, kind in DATA_LAYERS.items() if kind.feed == feed)


def load_families() -> None:
    """Import every family module once so their registrations run: BVLC's
    (:mod:`caffe2jax.lowering.layers`), then the forks' (:mod:`caffe2jax.lowering.forks`)."""
    from caffe2jax.lowering import forks, layers  # noqa: F401
