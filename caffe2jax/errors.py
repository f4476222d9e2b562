"""Moved to :mod:`caffe2jax.frontend.errors`; this name stays an alias of that one module."""

import sys

from caffe2jax.frontend import errors as _module

sys.modules[__name__] = _module
