"""Devices and meshes (Caffe's ``-gpu``), data-parallel training, multi-host set-up, and
whether a net fits in memory."""
