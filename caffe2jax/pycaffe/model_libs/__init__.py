"""The SSD fork's ``caffe.model_libs`` (weiliu89/caffe, branch ssd, python/caffe/model_libs.py):
the network builders its net generators (``examples/ssd/ssd_pascal.py``, ``ssd_coco.py`` …)
and the SSD-derived forks' generators import with ``from caffe.model_libs import *``, written
from what each function emits on caffe2jax's :class:`~caffe2jax.pycaffe.net_spec.NetSpec`:
the same layers, names, types, bottoms/tops, parameters and order.

``caffe2jax.model_libs`` and, with ``caffe`` aliased to caffe2jax
(:func:`caffe2jax.install_as_caffe`), ``caffe.model_libs`` are this package;
``caffe.mobilenet`` is :mod:`caffe2jax.pycaffe.model_libs.mobilenet`. A star import gives what
the fork's module gives (its functions and ``os``, ``caffe``, ``L``, ``P``, ``caffe_pb2``) and,
for those Python 2 scripts under Python 3, ``xrange`` and a ``caffe_pb2`` whose constructors take
an integral float for an integer field (:mod:`caffe2jax.pycaffe.model_libs.compat`)."""

from __future__ import annotations

import os

import caffe2jax as caffe
from caffe2jax.pycaffe.model_libs.basics import (
    ConvBNLayer,
    CreateAnnotatedDataLayer,
    UnpackVariable,
    check_if_exist,
    make_if_not_exist,
)
from caffe2jax.pycaffe.model_libs.compat import caffe_pb2, xrange
from caffe2jax.pycaffe.model_libs.inception import InceptionTower, InceptionV3Body
from caffe2jax.pycaffe.model_libs.mobilenet import DepthwiseConv, MobileNetBody
from caffe2jax.pycaffe.model_libs.multibox import CreateMultiBoxHead
from caffe2jax.pycaffe.model_libs.resnet import ResBody, ResNet101Body, ResNet152Body
from caffe2jax.pycaffe.model_libs.vgg import VGGNetBody, ZFNetBody
from caffe2jax.pycaffe.net_spec import layers as L
from caffe2jax.pycaffe.net_spec import params as P

#: the fork's public names, then the modules it imports (scripts use L, P and caffe_pb2 from the
#: star import), then the MobileNet generators' builders and Python 2's xrange
__all__ = [
    "check_if_exist",
    "make_if_not_exist",
    "UnpackVariable",
    "ConvBNLayer",
    "ResBody",
    "InceptionTower",
    "CreateAnnotatedDataLayer",
    "ZFNetBody",
    "VGGNetBody",
    "ResNet101Body",
    "ResNet152Body",
    "InceptionV3Body",
    "CreateMultiBoxHead",
    "os",
    "caffe",
    "L",
    "P",
    "caffe_pb2",
    "DepthwiseConv",
    "MobileNetBody",
    "xrange",
]
