"""Box maths once, in JAX, for every detection layer: overlap (IoU) with each fork's
convention as an argument, the box coders (SSD's and R-CNN's), greedy NMS on static shapes,
and SSD's ground-truth matching (weiliu89's util/bbox_util.cpp, py-faster-rcnn's
lib/utils/bbox.pyx and lib/fast_rcnn/bbox_transform.py)."""
