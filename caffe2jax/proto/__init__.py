"""pycaffe's ``caffe.proto``: ``from caffe2jax.proto import caffe_pb2``.

There is one generated module, :mod:`caffe2jax.frontend.caffe_pb2`; this package only gives it
pycaffe's import path (``import caffe2jax.proto.caffe_pb2`` works too), so messages made
through either name are the same classes.
"""

import sys

from caffe2jax.frontend import caffe_pb2

sys.modules[__name__ + ".caffe_pb2"] = caffe_pb2

__all__ = ["caffe_pb2"]
