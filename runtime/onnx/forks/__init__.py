"""ONNX converters of the forks' layers, one module per fork family (SSD, Faster R-CNN, R-FCN,
SegNet / PSPNet / DeepLab, YOLO ports, MobileNet / ShuffleNet / SENet, C3D)."""
