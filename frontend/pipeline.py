"""The frontend in one call: prototxt → parse → upgrade → filter → build → ir.Net."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.frontend.build import build_net
from caffe2jax.frontend.filter import filter_net, make_state
from caffe2jax.frontend.parse import read_net
from caffe2jax.frontend.upgrade import upgrade_net

NetSource = str | os.PathLike | bytes | caffe_pb2.NetParameter


def _describe(source: NetSource) -> tuple[str, str]:
    """(file name, text) of a source, for error messages; empty when not a text file."""
    if isinstance(source, caffe_pb2.NetParameter | bytes):
        return "", ""
    if isinstance(source, str) and ("\n" in source or "{" in source):
        return "<string>", source
    path = Path(source)
    try:
        return str(path), path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return str(path), ""


def load_param(source: NetSource) -> caffe_pb2.NetParameter:
    """Parse and upgrade a net definition (a path, prototxt text, bytes or a NetParameter)."""
    name, _ = _describe(source)
    net = source if isinstance(source, caffe_pb2.NetParameter) else read_net(source)
    return upgrade_net(net, source=name)


def load_net(
    source: NetSource,
    phase: str = ir.TEST,
    level: int = 0,
    stages: Iterable[str] = (),
    state: caffe_pb2.NetState | None = None,
) -> ir.Net:
    """The IR of ``source`` for a NetState (phase, level, stages; or an explicit ``state``).

    As in Caffe's Net constructor, the given stages add to the stages the net itself declares.
    """
    name, text = _describe(source)
    net = load_param(source)
    if state is None:
        state = make_state(phase, level, stages, base=net.state)
    return build_net(filter_net(net, state), source=name, text=text)
