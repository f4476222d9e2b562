"""Errors caffe2jax reports to users: one clear line each, no traceback from the CLI."""

from __future__ import annotations


class CaffeError(Exception):
    """Base class: the message is a complete, one-line explanation for the user."""


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
