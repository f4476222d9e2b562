"""Moved to :mod:`caffe2jax.frontend.ir`; this name stays an alias of that one module."""

import sys

from caffe2jax.frontend import ir as _module

sys.modules[__name__] = _module
