"""pycaffe's Python API: Net, Solver, Blob, Classifier, Detector, io, draw, net_spec, coord_map,
multigpu, process and mode (``caffe2jax`` re-exports their public names, as ``caffe`` does)."""
