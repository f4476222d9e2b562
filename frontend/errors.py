"""Errors caffe2jax reports to users: one clear line each, no traceback from the CLI."""

from __future__ import annotations

MAX_MESSAGE = 320  # a hard cap (a terminal line or two); messages are written to stay near 200
# plus the file's path, which may be long (a user's folders, a test's tmp_path)


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` on one line (whitespace runs become one space, control characters escaped),
    at most ``limit`` characters: a longer one keeps its start (file:line:col, what failed)
    and its end, with " ... " between."""
    text = " ".join(str(text).split())
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return text[:head] + " ... " + text[-(limit - head - 5) :]


class CaffeError(Exception):
    """Base class: the message is a complete, one-line explanation for the user (made one
    line of at most ``MAX_MESSAGE`` characters whatever the text it is given)."""

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str):
            args = (one_line(args[0]),)
        super().__init__(*args)


class PrototxtError(CaffeError):
    """A net or solver definition that does not parse (message starts with file:line:col)."""


class NetError(CaffeError):
    """A net that parses but is not a valid Caffe net (bad wiring, unknown type, shapes)."""


class InputShapeError(NetError):
    """An input blob whose shape only its data source knows, and none was given."""


class WeightsError(CaffeError):
    """A weights file that cannot be read or does not fit the net (names layer/blob/shape)."""


class SolverError(CaffeError):
    """A solver definition Caffe would refuse."""


class DataError(CaffeError):
    """Input data that cannot be read (names the file and record)."""
