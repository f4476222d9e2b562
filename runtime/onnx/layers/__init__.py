"""ONNX converters of BVLC Caffe's layer families, one module per family (as lowering/)."""
