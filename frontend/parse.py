"""Prototxt text (or binary protobuf) → caffe_pb2 messages, with file:line:col errors.

Reproduces what Caffe's ReadProtoFromTextFile / ReadProtoFromBinaryFile accept: protobuf text
format (singular fields set once), or a serialized binary message. Text is read by field name,
so a fork's prototxt parses whatever numbers the fork used; binary messages are decoded with
the numbers of the fork that wrote them (:mod:`caffe2jax.frontend.forks.schema`).

Templates: some forks ship prototxts with ``${NAME}`` placeholders that their scripts fill in
before running Caffe (DeepLab's ``${NUM_LABELS}``); ``defines={"NUM_LABELS": "21"}`` does the
same here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from google.protobuf import message, text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import PrototxtError
from caffe2jax.frontend.forks import user_proto
from caffe2jax.frontend.forks.catalog import FORKS
from caffe2jax.frontend.forks.dialect import BVLC, Dialect, DialectError
from caffe2jax.frontend.forks.layer_types import UNKNOWN_FORK_FIELDS
from caffe2jax.frontend.forks.schema import decode, decode_net
from caffe2jax.frontend.layer_text import enclosing_layer, misspelt

M = TypeVar("M", bound=message.Message)

_POSITION = re.compile(r"^(\d+):(\d+) : (.*)$", re.S)
_NO_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_NO_VALUE = re.compile(r'Enum type "([\w.]+)" has no value named (\w+)')
_TEMPLATE = re.compile(r"\$\{(\w+)\}")


_TOKEN_LIMIT = 40


def _clip(token: str, limit: int = _TOKEN_LIMIT) -> str:
    return token if len(token) <= limit else token[: limit - 3] + "..."


def _token_at(text: str, line: int, column: int) -> str:
    """The token at line:column (clipped: the offending token, never the whole line)."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        return "<end of file>"
    rest = lines[line - 1][max(column - 1, 0) :]
    match = re.match(r'\s*("[^"]*"|\$\{\w+\}|[\w.+-]+|\S)', rest)
    return _clip(match.group(1)) if match else "<end of line>"


def _drop_echo(detail: str, text: str, line: int) -> str:
    """protobuf's ParseError repeats the whole offending line (``'<line>': problem``):
    keep the problem only."""
    lines = text.split("\n")
    if 1 <= line <= len(lines):
        echo = f"'{lines[line - 1]}': "
        if detail.startswith(echo):
            return detail[len(echo) :]
    return (
        re.sub(r"^'.*?': ", "", detail, count=1, flags=re.S) if detail.startswith("'") else detail
    )


def _explain(detail: str, message_type: type[message.Message], token: str = "") -> str:
    """Rewrite protobuf's wording into Caffe terms: unknown fields and V1 types of forks name
    their fork, template variables say how to fill them, other unknown fields get a
    suggestion."""
    template = _TEMPLATE.match(token.strip('"'))
    if template:
        name = template.group(1)
        return (
            f"template variable ${{{name}}}: this prototxt is a template whose scripts fill "
            f"in ${{...}} before running Caffe; give its value (defines={{'{name}': ...}}, "
            f"--define {name}=...)"
        )
    value = _NO_VALUE.search(detail)
    if value and value.group(1) == "caffe.V1LayerParameter.LayerType":
        forks = ", ".join(f.name for f in FORKS if f.v1_types)
        return (
            f"unknown V1 layer type {value.group(2)} (caffe2jax reads BVLC's V1 types and "
            f"those of {forks})"
        )
    match = _NO_FIELD.search(detail)
    if not match:
        return detail.rstrip(".")
    owner, name = match.groups()
    if name in UNKNOWN_FORK_FIELDS:
        return (
            f"'{name}' is a field of {UNKNOWN_FORK_FIELDS[name]}, which caffe2jax does not "
            "support yet"
        )
    msg_name = owner.split(".")[-1]
    hint = misspelt(name, _fields_of(owner, message_type))
    what = "layer parameter or field" if msg_name == "LayerParameter" else "field"
    text = f"unknown {what} '{name}' in {msg_name}"
    return text + (f" (did you mean '{hint}'?)" if hint else "")


def _fields_of(full_name: str, root: type[message.Message]) -> list[str]:
    pool = root.DESCRIPTOR.file.pool
    try:
        return [f.name for f in pool.FindMessageTypeByName(full_name).fields]
    except KeyError:
        return []


def substitute(text: str, defines: Mapping[str, object] | None) -> str:
    """``text`` with each ``${NAME}`` of ``defines`` replaced by its value (others kept)."""
    if not defines:
        return text
    return _TEMPLATE.sub(lambda m: str(defines.get(m.group(1), m.group(0))), text)


def parse_text(
    text: str,
    message_type: type[M],
    filename: str = "<string>",
    defines: Mapping[str, object] | None = None,
) -> M:
    """Parse protobuf text format into a new ``message_type``; errors name file:line:col.
    ``${NAME}`` placeholders named in ``defines`` are filled in first."""
    text = substitute(text, defines)
    msg = message_type()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as err:
        line, column, detail = err.GetLine(), err.GetColumn(), str(err)
        pos = _POSITION.match(detail)
        if pos:
            line, column, detail = int(pos.group(1)), int(pos.group(2)), pos.group(3)
        raise _parse_error(text, filename, line or 0, column or 0, detail, message_type) from None
    return msg


def _parse_error(text, filename, line, column, detail, message_type) -> PrototxtError:
    """file:line:col, the layer the position lies in (as every error about a layer names
    it), what went wrong in Caffe's terms, the token. The error keeps ``layer`` (name, type
    as written; None outside a layer) and ``field`` (an unknown field's name, else None)."""
    token = _token_at(text, line, column)
    where = f"{filename}:{line or '?'}:{column or '?'}"
    detail = _clip(_drop_echo(detail, text, line), 120)
    is_net = message_type.DESCRIPTOR.full_name == "caffe.NetParameter"
    layer = enclosing_layer(text, line, column) if is_net else None
    kind = f" (type {layer[1]})" if layer and layer[1] else ""
    named = f"layer '{layer[0]}'{kind}: " if layer else ""
    err = PrototxtError(f"{where}: {named}{_explain(detail, message_type, token)} "
                        f"(at token {token!r})")  # fmt: skip
    unknown = _NO_FIELD.search(detail)
    err.layer, err.field = layer, unknown.group(2) if unknown else None
    return err


def parse_binary(
    data: bytes,
    message_type: type[M],
    filename: str = "<bytes>",
    dialect: str | Dialect | None = None,
) -> M:
    """Parse a serialized binary message written with ``dialect``'s numbers (a NetParameter:
    by default the dialect its own bytes point to; other messages: BVLC's); a clear error
    when the bytes are not one, or hold numbers the dialect does not have."""
    try:
        if message_type.DESCRIPTOR.full_name == "caffe.NetParameter":
            return decode_net(data, dialect, filename)
        return decode(data, message_type.DESCRIPTOR.name, dialect or BVLC, filename)
    except (message.DecodeError, RuntimeError, ValueError) as err:
        kind = message_type.DESCRIPTOR.name
        raise PrototxtError(f"{filename}: not a binary {kind} ({_clip(str(err), 100)})") from None


_CONTROL = frozenset(range(0x20)) - {0x09, 0x0A, 0x0D} | {0x7F}


def _looks_binary(data: bytes) -> bool:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return any(ch in text for ch in "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0e\x0f")


def _looks_text(data: bytes) -> bool:
    """A text prototxt with a stray byte: it starts like text (a field name or a comment) and
    nearly all of its first 4 KB are printable."""
    head = data[:4096].lstrip()
    if not head or not (head[:1].isalpha() or head[:1] in b"#_"):
        return False
    odd = sum(1 for b in head if b in _CONTROL)
    return odd <= max(4, len(head) // 50)


def _parse_bytes(
    data: bytes, message_type: type[M], filename: str, dialect=None, defines=None
) -> M:
    """Caffe tries text for .prototxt files and binary otherwise; here: text unless the bytes
    look binary, and a file that is neither is reported as the text it looks like (with
    file:line:col at the bad byte) rather than as a corrupt binary message."""
    if not _looks_binary(data):
        return parse_text(data.decode("utf-8"), message_type, filename, defines)
    try:
        return parse_binary(data, message_type, filename, dialect)
    except (PrototxtError, DialectError):
        if not _looks_text(data):
            raise
    return parse_text(data.decode("utf-8", errors="replace"), message_type, filename, defines)


def read_message(
    source: str | os.PathLike | bytes,
    message_type: type[M],
    *,
    dialect: str | Dialect | None = None,
    defines: Mapping[str, object] | None = None,
) -> M:
    """Read a message from a path (text or binary file), prototxt text, or binary bytes.

    A ``str`` containing a newline or ``{`` is prototxt text; any other ``str`` is a path.
    ``dialect`` is the fork numbering of a binary message (see :func:`parse_binary`);
    ``defines`` fill a template's ``${NAME}`` placeholders.
    """
    if isinstance(source, bytes):
        return _parse_bytes(source, message_type, "<bytes>", dialect, defines)
    if isinstance(source, str) and ("\n" in source or "{" in source):
        return parse_text(source, message_type, defines=defines)
    path = Path(source)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PrototxtError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise PrototxtError(f"{path}: is a directory, expected a prototxt file") from None
    except OSError as err:
        raise PrototxtError(f"{path}: cannot read ({err.strerror})") from None
    return _parse_bytes(data, message_type, str(path), dialect, defines)


def read_net(
    source: str | os.PathLike | bytes,
    *,
    dialect: str | Dialect | None = None,
    defines: Mapping[str, object] | None = None,
) -> caffe_pb2.NetParameter:
    """A NetParameter from a .prototxt path, prototxt text, or a binary NetParameter (decoded
    with ``dialect``'s numbers; by default those its bytes point to). A fork brought as its
    caffe.proto (``dialect="x.proto"``, or activated: :mod:`caffe2jax.frontend.forks.user_proto`)
    adds its own fields to the text's schema; they ride in the result as unknown fields."""
    fork = user_proto.fork_of(dialect)
    if fork is None:
        return read_message(source, caffe_pb2.NetParameter, dialect=dialect, defines=defines)
    net = read_message(source, fork.text_class("NetParameter"), dialect=dialect, defines=defines)
    return user_proto.to_caffe(net)


def read_solver(source: str | os.PathLike | bytes) -> caffe_pb2.SolverParameter:
    """A SolverParameter from a solver .prototxt path or text."""
    return read_message(source, caffe_pb2.SolverParameter)
