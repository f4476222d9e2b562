"""Layer-agnostic kernels (oneDNN, pooling windows, precision, convolution forms) and the one
engine policy that picks among them. Imports nothing of the layer families, graph or registry."""
