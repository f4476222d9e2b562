"""Leaving the process at once, from where Python's own exit cannot run: a signal handler
answering a second Ctrl-C, a watchdog thread while the main thread waits inside JAX.

``os._exit`` skips atexit handlers and the wait for non-daemon threads (the data pipeline's
prefetch and worker threads), which is the point there; what the user must read is written to
stderr and flushed first.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def exit_now(status: int, message: str = "") -> NoReturn:
    """Write ``message`` (a whole line, newline included) to stderr and end the process with
    ``status`` now, without unwinding."""
    if message:
        sys.stderr.write(message)
    sys.stderr.flush()
    os._exit(status)
