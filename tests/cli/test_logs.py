"""caffe2jax/logs.py: the terminal check reads the stderr of the moment, and a closed
stream (a test's captured stderr, a detached pipe) is not a terminal rather than an error."""

from __future__ import annotations

import io
import sys

from caffe2jax import logs


def test_is_terminal_reads_the_current_stderr(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Tty())
    assert logs.is_terminal() is True
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert logs.is_terminal() is False


def test_a_closed_stream_is_not_a_terminal():
    stream = io.StringIO()
    stream.close()
    assert logs.is_terminal(stream) is False
