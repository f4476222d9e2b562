"""The frontend in one call: prototxt → parse → dialect → upgrade → filter → build → ir.Net."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.frontend.build import build_net
from caffe2jax.frontend.errors import PrototxtError
from caffe2jax.frontend.filter import filter_net, make_state
from caffe2jax.frontend.forks import user_proto
from caffe2jax.frontend.forks.dialect import Dialect, detect, get
from caffe2jax.frontend.forks.upgrade import FORK_V1_TYPES
from caffe2jax.frontend.parse import read_net, substitute
from caffe2jax.frontend.upgrade import V1_LAYER_TYPES, upgrade_net

NetSource = str | os.PathLike | bytes | caffe_pb2.NetParameter


def _describe(source: NetSource, defines: Mapping[str, object] | None) -> tuple[str, str]:
    """(file name, text) of a source, for error messages; empty when not a text file."""
    if isinstance(source, caffe_pb2.NetParameter | bytes):
        return "", ""
    if isinstance(source, str) and ("\n" in source or "{" in source):
        return "<string>", substitute(source, defines)
    path = Path(source)
    try:
        return str(path), substitute(path.read_text(encoding="utf-8"), defines)
    except (OSError, UnicodeDecodeError):
        return str(path), ""


def type_first(err: PrototxtError, layer_types: Callable[[str], str | None] | None):
    """``err`` (a parse error inside a layer) saying first what ``layer_types`` says of the
    layer's type, when it says something: an unknown ``transpose_param`` matters less than a
    ``Transpose`` type caffe2jax does not run. Otherwise ``err`` itself."""
    layer, field = getattr(err, "layer", None), getattr(err, "field", None)
    if layer_types is None or not layer or not layer[1]:
        return err
    kind = V1_LAYER_TYPES.get(layer[1]) or FORK_V1_TYPES.get(layer[1]) or layer[1]
    problem = layer_types(kind)
    if problem is None:
        return err
    where = str(err).split(": layer '", 1)[0]
    field_note = f"; its field '{field}' is unknown too" if field else ""
    shown = kind if len(kind) <= 40 else kind[:40] + "…"
    out = PrototxtError(f"{where}: layer '{layer[0]}' (type {shown}): {problem}{field_note}")
    out.layer, out.field = layer, field
    return out


def read_param(
    source: NetSource,
    dialect: str | Dialect | None = None,
    defines: Mapping[str, object] | None = None,
) -> tuple[caffe_pb2.NetParameter, Dialect]:
    """The net as written (not upgraded) and its dialect: ``dialect`` when given, else the
    one its text points to (:func:`caffe2jax.frontend.forks.dialect.detect`)."""
    if dialect is None and user_proto.active() is not None:
        dialect = user_proto.active().key
    if isinstance(source, caffe_pb2.NetParameter):
        net = source
    else:
        net = read_net(source, dialect=dialect, defines=defines)
    return net, get(dialect) if dialect is not None else detect(net)


def load_param(
    source: NetSource,
    dialect: str | Dialect | None = None,
    defines: Mapping[str, object] | None = None,
) -> caffe_pb2.NetParameter:
    """Parse and upgrade a net definition (a path, prototxt text, bytes or a NetParameter)."""
    name, text = _describe(source, defines)
    net, _ = read_param(source, dialect, defines)
    return upgrade_net(net, source=name, text=text)


def load_net(
    source: NetSource,
    phase: str = ir.TEST,
    level: int = 0,
    stages: Iterable[str] = (),
    state: caffe_pb2.NetState | None = None,
    *,
    dialect: str | Dialect | None = None,
    defines: Mapping[str, object] | None = None,
    layer_types: Callable[[str], str | None] | None = None,
) -> ir.Net:
    """The IR of ``source`` for a NetState (phase, level, stages; or an explicit ``state``).

    As in Caffe's Net constructor, the given stages add to the stages the net itself declares.
    ``dialect`` overrides the fork numbering detected from the text (it decides how the net's
    binary files are read and the layer forms the text leaves open); ``defines`` fill a
    template's ``${NAME}`` placeholders. ``layer_types(type)`` says what is wrong with a layer
    type the caller cannot run (None: nothing): a field error inside such a layer then says
    the type first (see :func:`type_first`).
    """
    name, text = _describe(source, defines)
    try:
        raw, chosen = read_param(source, dialect, defines)
    except PrototxtError as err:
        raise type_first(err, layer_types) from None
    net = upgrade_net(raw, source=name, text=text)
    if state is None:
        state = make_state(phase, level, stages, base=net.state)
    return build_net(filter_net(net, state), source=name, text=text, dialect=chosen)
