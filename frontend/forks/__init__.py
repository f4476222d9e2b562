"""Caffe's forks in the frontend: their numbering (:mod:`.catalog`), the dialect a net is read
in (:mod:`.dialect`, :mod:`.schema`), their layer types (:mod:`.layer_types`), the forms a
type string takes (:mod:`.forms`) and the upgrades of their deprecated forms (:mod:`.upgrade`).
"""
