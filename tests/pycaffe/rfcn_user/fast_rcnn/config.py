"""py-R-FCN's lib/fast_rcnn/config.py as its layers read it, with
experiments/cfgs/rfcn_end2end_ohem.yml applied (cfg_from_file): ``cfg.TRAIN.X`` and
``cfg['TRAIN'].X`` both work, as with the original's EasyDict."""


class Config(dict):
    """A dict whose keys are also attributes (EasyDict's use in py-R-FCN)."""

    __getattr__ = dict.__getitem__
    __setattr__ = dict.__setitem__


cfg = Config(
    TRAIN=Config(
        SCALES=(64,),  # the tests' images (the original: (600,), MAX_SIZE 1000)
        MAX_SIZE=64,
        IMS_PER_BATCH=1,
        HAS_RPN=True,
        AGNOSTIC=True,  # the yml's
        BATCH_SIZE=-1,  # the yml's: every roi kept
        FG_FRACTION=0.25,
        FG_THRESH=0.5,
        BG_THRESH_HI=0.5,
        BG_THRESH_LO=0.0,  # the yml's (the default 0.1)
        BBOX_INSIDE_WEIGHTS=(1.0, 1.0, 1.0, 1.0),
        BBOX_NORMALIZE_TARGETS_PRECOMPUTED=True,
        BBOX_NORMALIZE_MEANS=(0.0, 0.0, 0.0, 0.0),
        BBOX_NORMALIZE_STDS=(0.1, 0.1, 0.2, 0.2),
        RPN_NORMALIZE_TARGETS=True,  # the yml's
        RPN_NORMALIZE_MEANS=(0.0, 0.0, 0.0, 0.0),
        RPN_NORMALIZE_STDS=(0.1, 0.1, 0.2, 0.2),
        RPN_POSITIVE_OVERLAP=0.7,
        RPN_NEGATIVE_OVERLAP=0.3,
        RPN_CLOBBER_POSITIVES=False,
        RPN_FG_FRACTION=0.5,
        RPN_BATCHSIZE=256,
        RPN_BBOX_INSIDE_WEIGHTS=(1.0, 1.0, 1.0, 1.0),
        RPN_POSITIVE_WEIGHT=-1.0,
        RPN_PRE_NMS_TOP_N=6000,  # the yml's
        RPN_POST_NMS_TOP_N=300,  # the yml's
        RPN_NMS_THRESH=0.7,
        RPN_MIN_SIZE=16,
    ),
    TEST=Config(
        RPN_PRE_NMS_TOP_N=6000,
        RPN_POST_NMS_TOP_N=300,
        RPN_NMS_THRESH=0.7,
        RPN_MIN_SIZE=16,
        AGNOSTIC=True,
    ),  # fmt: skip
)
