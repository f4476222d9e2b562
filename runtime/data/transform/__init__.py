"""From a record to a batch row: image decoding (with its size guards), Caffe's
DataTransformer and SSD's annotated transform (samplers, distortions, box geometry)."""
