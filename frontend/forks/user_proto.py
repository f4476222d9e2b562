"""A fork brought by its user: the fork's own caffe.proto, compiled by protoc, as a dialect.

``dialect="path/to/caffe.proto"`` (``--dialect`` on the command line) names a fork caffe2jax
does not know. :func:`load` compiles the file with protoc (from ``grpcio-tools``: the
``fork-proto`` extra) into a descriptor, which becomes

* a :class:`UserFork` of :mod:`caffe2jax.frontend.forks.catalog` (its numbers: every field of
  the file), composed into a :class:`~caffe2jax.frontend.forks.dialect.Dialect` like the
  built-in forks (combined with one, ``"x.proto+ssd"``, their clashing numbers are recorded
  and a binary message is refused, one line); its number collisions with every built-in
  dialect are listed, one line each (:func:`caffe2jax.frontend.forks.proto_merge.collisions`),
  and logged once;
* the classes its prototxts parse with: caffe.proto plus the fork's own fields and messages
  (:func:`caffe2jax.frontend.forks.proto_merge.extend`). A parsed net stays caffe.proto's
  ``NetParameter``: the fork's fields ride in it as unknown fields, and
  :func:`readable_param` gives a layer's parameter back with them readable by name.

Weights files are read by each layer's name, type and blobs (numbers 1, 2 and 7 in BVLC and
in every fork): a fork that renumbers those, or BlobProto, is refused with file:line.
"""

from __future__ import annotations

import functools
import logging
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory, text_format
from google.protobuf import unknown_fields as unknown

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.frontend.forks.fork import Fork
from caffe2jax.frontend.forks.proto_merge import (
    bvlc_numbers,
    collisions,
    complete,
    extend,
    line_of,
    numbers,
)

log = logging.getLogger("caffe2jax")
_POSITION = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?P<col>\d+): (?P<text>.*)$", re.M)
#: What weights reading relies on: the numbers BVLC and every fork give these fields.
_FIXED = {"LayerParameter": ("name", "type", "blobs"), "NetParameter": ("name", "layer")}
_BLOB = "BlobProto"


class ForkProtoError(CaffeError):
    """A fork's caffe.proto that cannot be read or used (one line, file:line where known)."""


def is_proto(spec: object) -> bool:
    """Whether a ``dialect=`` part names a .proto file rather than a built-in fork."""
    return isinstance(spec, str | Path) and str(spec).endswith(".proto")


def _include_dir() -> str:
    try:
        import grpc_tools
    except ImportError:
        raise ForkProtoError(
            "reading a fork's caffe.proto needs protoc from grpcio-tools: "
            "pip install 'caffe2jax[fork-proto]'"
        ) from None
    return str(Path(grpc_tools.__file__).parent / "_proto")


def _protoc_error(stderr: str, path: Path) -> ForkProtoError:
    """protoc's first positioned message as ``path:line:col: text`` (else its first line)."""
    match = _POSITION.search(stderr)
    if match:
        text = match.group("text").strip()
        return ForkProtoError(f"{path}:{match.group('line')}:{match.group('col')}: {text}")
    first = next((ln for ln in stderr.splitlines() if ln.strip()), "protoc failed")
    return ForkProtoError(f"{path}: {first.strip()}")


def compile_proto(path: Path) -> descriptor_pb2.FileDescriptorSet:
    """``path`` compiled by protoc (imports resolved beside it), with source lines."""
    include = _include_dir()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fork.pb"
        cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{path.parent}", f"-I{include}",
               "--include_imports", "--include_source_info", f"--descriptor_set_out={out}",
               str(path)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0 or not out.exists():
            raise _protoc_error(done.stderr, path)
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _fork_file(files: descriptor_pb2.FileDescriptorSet, path: Path):
    """The compiled file that declares ``caffe.LayerParameter``."""
    for proto in files.file:
        if proto.package == "caffe" and any(m.name == "LayerParameter" for m in proto.message_type):
            return proto
    raise ForkProtoError(
        f"{path}: declares no message caffe.LayerParameter; a fork's caffe.proto has "
        "'package caffe;' and Caffe's LayerParameter"
    )


def _check_fixed(proto: descriptor_pb2.FileDescriptorProto, path: Path) -> None:
    """Refuse a fork that renumbers what weights files are read by."""
    ours, bvlc = numbers(proto), bvlc_numbers()
    fixed = {**_FIXED, _BLOB: tuple(bvlc[_BLOB])}
    index = {m.name: i for i, m in enumerate(proto.message_type)}
    for msg, names in fixed.items():
        for name in names:
            mine, theirs = ours.get(msg, {}).get(name), bvlc[msg][name]
            if mine is not None and mine != theirs:
                fields = [f.name for f in proto.message_type[index[msg]].field]
                line = line_of(proto, (4, index[msg], 2, fields.index(name))) or "?"
                raise ForkProtoError(
                    f"{path}:{line}: {msg}.{name} is {mine} here, {theirs} in BVLC Caffe; "
                    "caffe2jax reads weights files by BVLC's numbers for it"
                )


@dataclass(frozen=True, eq=False)
class UserFork(Fork):
    """A fork read from its user's caffe.proto: its numbers, and the classes its text
    parses with (``extended``: caffe.proto + the fork's own fields)."""

    file: descriptor_pb2.FileDescriptorProto | None = None
    extended: descriptor_pool.DescriptorPool | None = None
    own: descriptor_pool.DescriptorPool | None = None
    collisions: tuple[str, ...] = ()

    def text_class(self, name: str) -> type[message.Message]:
        """Message ``name`` of caffe.proto + this fork's fields (what its text parses into)."""
        found = self.extended.FindMessageTypeByName(f"caffe.{name}")
        return message_factory.GetMessageClass(found)

    def own_class(self, name: str) -> type[message.Message]:
        """Message ``name`` in the fork's own numbering (what its binary files hold)."""
        found = self.own.FindMessageTypeByName(f"caffe.{name}")
        return message_factory.GetMessageClass(found)


def _pool(*files: descriptor_pb2.FileDescriptorProto) -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for proto in files:
        pool.Add(proto)
    return pool


def _split(proto, bvlc) -> tuple[dict, dict]:
    """(adds, renumbers) of the fork's numbers against BVLC's, as catalog.Fork has them."""
    adds: dict[str, dict[str, int]] = {}
    renumbers: dict[str, dict[str, int]] = {}
    for msg, fields in numbers(proto).items():
        for name, number in fields.items():
            theirs = bvlc.get(msg, {}).get(name)
            if theirs is None:
                adds.setdefault(msg, {})[name] = number
            elif theirs != number:
                renumbers.setdefault(msg, {})[name] = number
    return adds, renumbers


@functools.cache
def _load(resolved: str, mtime: float) -> UserFork:
    path = Path(resolved)
    files = compile_proto(path)
    proto = _fork_file(files, path)
    _check_fixed(proto, path)
    others = [f for f in files.file if f.name != proto.name]
    extended = extend(proto, str(path))
    adds, renumbers = _split(proto, bvlc_numbers())
    lines = tuple(collisions(proto, str(path)))
    for line in lines[:5]:
        log.warning("%s", line)
    if len(lines) > 5:
        log.warning("%s: %d more numbers a built-in dialect uses differently", path, len(lines) - 5)
    return UserFork(resolved, f"the fork of {path.name}", resolved, adds=adds,
                    renumbers=renumbers, file=proto, extended=_pool(*others, extended),
                    own=_pool(*others, complete(proto)), collisions=lines)  # fmt: skip


def load(spec: str | Path) -> UserFork:
    """The fork of caffe.proto file ``spec`` (compiled once per file and modification)."""
    path = Path(spec).expanduser()
    try:
        resolved = path.resolve(strict=True)
        mtime = resolved.stat().st_mtime
    except OSError:
        raise ForkProtoError(f"{spec}: fork caffe.proto not found") from None
    if resolved.is_dir():
        raise ForkProtoError(f"{spec}: is a directory, expected a fork's caffe.proto")
    fork = _load(str(resolved), mtime)
    _LOADED[str(resolved)] = fork
    return fork


# The forks loaded in this process, latest last: a layer's parameter is made readable with the
# latest that knows every number it carries.
_LOADED: dict[str, UserFork] = {}
_ACTIVE: list[UserFork] = []


def activate(spec: str | Path | None) -> UserFork | None:
    """Parse every prototxt of this process with the fork of ``spec`` (the command line's
    ``--dialect x.proto``: a solver's nets read it too); None: no fork."""
    _ACTIVE.clear()
    if spec is None:
        return None
    fork = load(spec)
    _ACTIVE.append(fork)
    return fork


def active() -> UserFork | None:
    """The fork :func:`activate` chose, if any."""
    return _ACTIVE[0] if _ACTIVE else None


def fork_of(dialect: object) -> UserFork | None:
    """The user fork a ``dialect=`` value names (a .proto path, a Dialect holding one, a
    ``"+"``-joined spec), else the active one."""
    forks = getattr(dialect, "forks", None)
    if forks is not None:
        found = [f for f in forks if isinstance(f, UserFork)]
        return found[0] if found else active()
    if isinstance(dialect, str | Path):
        parts = [p.strip() for p in str(dialect).split("+")]
        found = [p for p in parts if is_proto(p)]
        return load(found[0]) if found else active()
    return active()


def to_caffe(msg: message.Message, name: str = "NetParameter") -> message.Message:
    """A message of a fork's schema as caffe.proto's class (its own fields kept as unknown
    fields, which survive copies and serialization)."""
    return getattr(caffe_pb2, name).FromString(msg.SerializeToString())


def readable_param(param: message.Message) -> message.Message:
    """A layer's ``caffe_pb2.LayerParameter`` with the fields of the loaded fork that knows
    every number it carries readable by name (itself when no fork was loaded)."""
    data = param.SerializeToString()
    for fork in reversed(list(_LOADED.values())):
        cls = fork.text_class("LayerParameter")
        readable = cls.FromString(data)
        if not len(unknown.UnknownFieldSet(readable)):
            return readable
    return param


def decode_net(data: bytes, fork: UserFork, where: str) -> caffe_pb2.NetParameter:
    """A binary NetParameter written by ``fork`` (its own numbers), as caffe.proto's."""
    try:
        raw = fork.own_class("NetParameter").FromString(data)
    except message.DecodeError as err:
        raise ForkProtoError(f"{where}: not a binary NetParameter of {fork.name} ({err})") from None
    text = text_format.MessageToString(raw)
    return to_caffe(text_format.Parse(text, fork.text_class("NetParameter")()))
