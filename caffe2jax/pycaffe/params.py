"""A pycaffe net's param blobs: one :class:`Blob` per owned param blob, shared the way Caffe
shares them (between layers naming the same param, and between a solver's train net and its
test nets), and the param and state trees the compiled programs take."""

from __future__ import annotations

from typing import Any

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.graph import Graph
from caffe2jax.lowering.registry import NetState, carry_of
from caffe2jax.pycaffe.blob import Blob


class ParamBlobs:
    """The param Blobs of a net by (layer, blob index) of their owner; values a layer carries
    between forwards (RNN/LSTM's h_T, not Caffe blobs) are kept aside in ``carry``.

    ``version`` counts the values shown (a driver notices a forward that moved BatchNorm's
    statistics); :meth:`written` tells whether a script may have written an array since.
    """

    def __init__(self, dtype: Any):
        self.dtype = dtype
        self.blobs: dict[tuple[str, int], Blob] = {}
        self.carry: dict[str, list] = {}
        self.version = 0

    def own(self, graph: Graph) -> None:
        """A Blob for every owned param blob of ``graph`` (a sharer's slot resolves to its
        owner's); ``graph`` is the one whose trees :meth:`values` gives."""
        self._order = []
        for name, j, decl in graph.owned():
            if (name, j) not in self.blobs:
                self.blobs[(name, j)] = Blob(decl.shape, self.dtype)
            self._order.append((name, j, decl.state, len(graph.decls[name]), tuple(decl.shape)))

    def of_layer(self, graph: Graph, key: str) -> list[Blob]:
        """Layer ``key``'s blobs in Caffe's order (shared ones are their owner's Blob)."""
        return [self.blobs[graph.shared.get((key, j), (key, j))]
                for j in range(len(graph.decls.get(key, [])))]  # fmt: skip

    def values(self) -> tuple[dict, NetState]:
        """The current params and state as the functional API takes them (what scripts
        wrote into the arrays included)."""
        params: dict[str, list] = {}
        state: dict[str, list] = {}
        blobs = self.blobs
        for name, j, is_state, count, shape in self._order:
            tree = state if is_state else params
            slots = tree.get(name)
            if slots is None:
                slots = tree[name] = [None] * count
            if tuple(blobs[(name, j)].shape) != shape:  # a script's Blob.reshape of a param
                raise NetError(f"layer '{name}': param blob {j} has shape "
                               f"{list(blobs[(name, j)].shape)}, the layer needs {list(shape)}; "
                               "reshape it back (or reshape the net's inputs)")  # fmt: skip
            slots[j] = blobs[(name, j)].device_data()
        return params, NetState(state, self.carry)

    def show(self, params: dict, state: dict) -> None:
        """New values for the Blobs (arrays users hold see them)."""
        self.version += 1
        self.carry.update({name: list(c) for name, c in carry_of(state).items()})
        for tree in (params, state):
            for name, values in tree.items():
                for j, value in enumerate(values):
                    if value is not None and (name, j) in self.blobs:
                        self.blobs[(name, j)].set_data(value)

    def written(self) -> bool:
        """Whether a script may have written a param array since its value was last set."""
        return any(blob.data_written() for blob in self.blobs.values())

    def diffs(self, graph: Graph) -> dict[str, list]:
        """Each param blob's diff as a tree shaped like ``graph.decls`` (None: not owned)."""
        return {
            name: [self.blobs[(name, j)].device_diff()
                   if (name, j) in self.blobs else None for j in range(len(decls))]
            for name, decls in graph.decls.items() if decls
        }  # fmt: skip

    def show_diffs(self, diffs: dict[str, list]) -> None:
        """New diffs (None slots keep theirs)."""
        for (name, j), blob in self.blobs.items():
            values = diffs.get(name)
            if values is not None and j < len(values) and values[j] is not None:
                blob.set_diff(values[j])

    def add_diffs(self, grads: dict[str, list], mask: dict[str, list[bool]]) -> None:
        """Caffe's layers add into ``param_diff``: ``grads`` added where ``mask`` says."""
        for name, flags in mask.items():
            for j, on in enumerate(flags):
                if on and grads.get(name) is not None and grads[name][j] is not None:
                    blob = self.blobs[(name, j)]
                    blob.set_diff(blob.device_diff() + grads[name][j])

    def clear_diffs(self) -> None:
        """Caffe's Net::ClearParamDiffs: every param diff to zero."""
        for blob in self.blobs.values():
            blob.set_diff(None)

    def share(self, other: ParamBlobs, where: str) -> None:
        """Caffe's ShareTrainedLayersWith: take ``other``'s Blobs by layer name (shapes must
        match; ``where`` names the other net in the error)."""
        for (name, j), blob in list(self.blobs.items()):
            theirs = other.blobs.get((name, j))
            if theirs is None or theirs is blob:
                continue
            if theirs.shape != blob.shape:
                raise NetError(
                    f"cannot share layer '{name}' blob {j}: its shape is {list(blob.shape)} "
                    f"here and {list(theirs.shape)} in net '{where}'"
                )
            self.blobs[(name, j)] = theirs
