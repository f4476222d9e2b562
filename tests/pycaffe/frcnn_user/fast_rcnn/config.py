"""The config of py-faster-rcnn's lib/fast_rcnn/config.py as its layers read it (end2end
values, experiments/cfgs/faster_rcnn_end2end.yml): ``cfg.TRAIN.X`` and ``cfg['TRAIN'].X``
both work, as with the original's EasyDict. Scripts change it in place (cfg_from_file)."""


class Config(dict):
    """A dict whose keys are also attributes (EasyDict's use in py-faster-rcnn)."""

    __getattr__ = dict.__getitem__
    __setattr__ = dict.__setitem__


cfg = Config(
    TRAIN=Config(
        SCALES=(64,),  # the mini checkout's images (the original: (600,), MAX_SIZE 1000)
        MAX_SIZE=64,
        RPN_PRE_NMS_TOP_N=12000,
        RPN_POST_NMS_TOP_N=2000,
        RPN_NMS_THRESH=0.7,
        RPN_MIN_SIZE=16,
        BATCH_SIZE=128,
        FG_FRACTION=0.25,
        FG_THRESH=0.5,
        BG_THRESH_HI=0.5,
        BG_THRESH_LO=0.0,
        BBOX_INSIDE_WEIGHTS=(1.0, 1.0, 1.0, 1.0),
        BBOX_NORMALIZE_TARGETS_PRECOMPUTED=True,
        BBOX_NORMALIZE_MEANS=(0.0, 0.0, 0.0, 0.0),
        BBOX_NORMALIZE_STDS=(0.1, 0.1, 0.2, 0.2),
    ),
    TEST=Config(
        RPN_PRE_NMS_TOP_N=6000, RPN_POST_NMS_TOP_N=300, RPN_NMS_THRESH=0.7, RPN_MIN_SIZE=16
    ),  # fmt: skip
)
