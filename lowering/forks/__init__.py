"""The forks' layers, one module per fork family, named by fork. A fork's variant of a BVLC
type is registered under a key that carries its form (``register("Dropout",
form="scale_train")``); the BVLC body in :mod:`caffe2jax.lowering.layers` never reads it."""
