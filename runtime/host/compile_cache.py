"""JAX's persistent compilation cache, on by default for every way in (the functional API,
pycaffe, the CLI): a second run of a net loads its compiled programs from disk instead of
compiling them again.

The cache lives in ``$CAFFE2JAX_CACHE_DIR``, else in the OS's user cache folder (platformdirs):
``$XDG_CACHE_HOME/caffe2jax/xla`` (``~/.cache/caffe2jax/xla``) on Linux.
``CAFFE2JAX_NO_COMPILE_CACHE=1`` (or the CLI's
``--no-compile-cache``) turns it off. A cache the user configured for JAX themselves
(``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``) is left as it is. Every program is kept,
however fast it compiled: a pycaffe script compiles a handful, most under a second, and each
saved second counts at start-up.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import platformdirs

from caffe2jax.frontend import environment

NO_CACHE_ENV = "CAFFE2JAX_NO_COMPILE_CACHE"
CACHE_DIR_ENV = "CAFFE2JAX_CACHE_DIR"
_JAX_DIR_ENV = "JAX_COMPILATION_CACHE_DIR"
# set beside JAX's variable when this module wrote it: a child process inherits both and
# knows the folder was caffe2jax's default, not the user's choice
_OURS_ENV = "CAFFE2JAX_DEFAULT_JAX_CACHE_DIR"
# what JAX reads from the environment when it is imported, and the config names they set
_SETTINGS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": ("jax_persistent_cache_min_compile_time_secs",
                                                   0.0),
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": ("jax_persistent_cache_min_entry_size_bytes", 0),
}  # fmt: skip
_ours: Path | None = None  # the folder this module set, if any
_decided = False  # an entry point chose (the CLI's --no-compile-cache): the default stays out
_off = False  # enable(False) turned it off (the startup cache follows: startup_cache.py)


def cache_dir() -> Path:
    """``$CAFFE2JAX_CACHE_DIR``, else the OS's user cache folder (platformdirs) + ``caffe2jax/xla``:
    ``$XDG_CACHE_HOME/caffe2jax/xla`` (``~/.cache/...``) on Linux, ``~/Library/Caches/...`` on
    macOS, ``%LOCALAPPDATA%\\caffe2jax\\Cache\\xla`` on Windows."""
    if environment.value(CACHE_DIR_ENV):
        return Path(environment.value(CACHE_DIR_ENV))
    return Path(platformdirs.user_cache_dir("caffe2jax", appauthor=False)) / "xla"


def switched_off() -> bool:
    """Whether ``$CAFFE2JAX_NO_COMPILE_CACHE`` turns the cache off (anything but 0/empty)."""
    return environment.value(NO_CACHE_ENV) not in ("", "0")


def turned_off() -> bool:
    """Whether an entry point turned the cache off for this process (``enable(False)``)."""
    return _off


def _users_own() -> bool:
    """Whether the user pointed JAX at a cache of their own."""
    theirs = os.environ.get(_JAX_DIR_ENV)
    if theirs and theirs not in (str(_ours), environment.value(_OURS_ENV)):
        return True
    if "jax" in sys.modules:
        current = sys.modules["jax"].config.jax_compilation_cache_dir
        return bool(current) and (_ours is None or current != str(_ours))
    return False


def enable(compile_cache: bool = True) -> Path | None:
    """Turn the cache on (or, with ``compile_cache`` false or the environment switch, off)
    for this process; returns the folder in use, or None. Works before JAX is imported
    (through the environment JAX reads) and after (through ``jax.config``)."""
    global _ours, _decided, _off
    _decided = True
    _off = not compile_cache
    if _users_own():
        return None
    if not compile_cache or switched_off():
        _disable()
        return None
    folder = cache_dir()
    _ours = folder
    if "jax" not in sys.modules:
        os.environ[_JAX_DIR_ENV] = os.environ[_OURS_ENV] = str(folder)
        for env, (_, value) in _SETTINGS.items():
            os.environ.setdefault(env, str(value))
        return folder
    config = sys.modules["jax"].config
    config.update("jax_compilation_cache_dir", str(folder))
    config.update("jax_enable_compilation_cache", True)
    for _, (name, value) in _SETTINGS.items():
        config.update(name, value)
    return folder


def enable_by_default() -> Path | None:
    """:func:`enable` unless an entry point already chose (called when caffe2jax's compiling
    part is first imported, whichever way in)."""
    return None if _decided else enable()


def _disable() -> None:
    global _ours
    current = os.environ.get(_JAX_DIR_ENV)
    if current and current in (str(_ours), environment.value(_OURS_ENV)):
        del os.environ[_JAX_DIR_ENV]
    if "jax" in sys.modules:
        sys.modules["jax"].config.update("jax_enable_compilation_cache", False)
    _ours = None
