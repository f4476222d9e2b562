"""Prototxt text (or binary protobuf) → caffe_pb2 messages, with file:line:col errors.

Reproduces what Caffe's ReadProtoFromTextFile / ReadProtoFromBinaryFile accept: protobuf text
format (singular fields set once), or a serialized binary message.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import TypeVar

from google.protobuf import message, text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import PrototxtError

M = TypeVar("M", bound=message.Message)

_POSITION = re.compile(r"^(\d+):(\d+) : (.*)$", re.S)
_NO_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')


_TOKEN_LIMIT = 40


def _clip(token: str, limit: int = _TOKEN_LIMIT) -> str:
    return token if len(token) <= limit else token[: limit - 3] + "..."


def _token_at(text: str, line: int, column: int) -> str:
    """The token at line:column (clipped: the offending token, never the whole line)."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        return "<end of file>"
    rest = lines[line - 1][max(column - 1, 0) :]
    match = re.match(r'\s*("[^"]*"|[\w.+-]+|\S)', rest)
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


def _explain(detail: str, message_type: type[message.Message]) -> str:
    """Rewrite protobuf's wording into Caffe terms, with a suggestion for unknown fields."""
    match = _NO_FIELD.search(detail)
    if not match:
        return detail.rstrip(".")
    owner, name = match.groups()
    msg_name = owner.split(".")[-1]
    known = _fields_of(owner, message_type)
    hint = difflib.get_close_matches(name, known, n=1)
    what = "layer parameter or field" if msg_name == "LayerParameter" else "field"
    text = f"unknown {what} '{name}' in {msg_name}"
    return text + (f" (did you mean '{hint[0]}'?)" if hint else "")


def _fields_of(full_name: str, root: type[message.Message]) -> list[str]:
    pool = root.DESCRIPTOR.file.pool
    try:
        return [f.name for f in pool.FindMessageTypeByName(full_name).fields]
    except KeyError:
        return []


def parse_text(text: str, message_type: type[M], filename: str = "<string>") -> M:
    """Parse protobuf text format into a new ``message_type``; errors name file:line:col."""
    msg = message_type()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as err:
        line, column, detail = err.GetLine(), err.GetColumn(), str(err)
        pos = _POSITION.match(detail)
        if pos:
            line, column, detail = int(pos.group(1)), int(pos.group(2)), pos.group(3)
        token = _token_at(text, line or 0, column or 0)
        where = f"{filename}:{line or '?'}:{column or '?'}"
        detail = _clip(_drop_echo(detail, text, line or 0), 120)
        raise PrototxtError(
            f"{where}: {_explain(detail, message_type)} (at token {token!r})"
        ) from None
    return msg


def parse_binary(data: bytes, message_type: type[M], filename: str = "<bytes>") -> M:
    """Parse a serialized binary message; a clear error when the bytes are not one."""
    msg = message_type()
    try:
        msg.ParseFromString(data)
    except (message.DecodeError, RuntimeError, ValueError) as err:
        kind = message_type.DESCRIPTOR.name
        raise PrototxtError(f"{filename}: not a binary {kind} ({_clip(str(err), 100)})") from None
    return msg


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


def _parse_bytes(data: bytes, message_type: type[M], filename: str) -> M:
    """Caffe tries text for .prototxt files and binary otherwise; here: text unless the bytes
    look binary, and a file that is neither is reported as the text it looks like (with
    file:line:col at the bad byte) rather than as a corrupt binary message."""
    if not _looks_binary(data):
        return parse_text(data.decode("utf-8"), message_type, filename)
    try:
        return parse_binary(data, message_type, filename)
    except PrototxtError:
        if not _looks_text(data):
            raise
    return parse_text(data.decode("utf-8", errors="replace"), message_type, filename)


def read_message(source: str | os.PathLike | bytes, message_type: type[M]) -> M:
    """Read a message from a path (text or binary file), prototxt text, or binary bytes.

    A ``str`` containing a newline or ``{`` is prototxt text; any other ``str`` is a path.
    """
    if isinstance(source, bytes):
        return _parse_bytes(source, message_type, "<bytes>")
    if isinstance(source, str) and ("\n" in source or "{" in source):
        return parse_text(source, message_type)
    path = Path(source)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PrototxtError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise PrototxtError(f"{path}: is a directory, expected a prototxt file") from None
    except OSError as err:
        raise PrototxtError(f"{path}: cannot read ({err.strerror})") from None
    return _parse_bytes(data, message_type, str(path))


def read_net(source: str | os.PathLike | bytes) -> caffe_pb2.NetParameter:
    """A NetParameter from a .prototxt path, prototxt text, or a binary NetParameter."""
    return read_message(source, caffe_pb2.NetParameter)


def read_solver(source: str | os.PathLike | bytes) -> caffe_pb2.SolverParameter:
    """A SolverParameter from a solver .prototxt path or text."""
    return read_message(source, caffe_pb2.SolverParameter)
