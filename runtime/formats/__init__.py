"""Caffe's file formats: caffemodel (binary, HDF5) and conversion, solverstate, BlobProto,
StableHLO export, and atomic writes of the user's files."""
