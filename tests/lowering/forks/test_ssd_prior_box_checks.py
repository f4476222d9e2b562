"""SSD's PriorBox (lowering/forks/ssd.py) refuses what the fork's LayerSetUp CHECKs refuse,
naming the layer, instead of returning NaN or infinite priors: img_h/img_w/img_size 0, a step
that is NaN, 0 or infinite, a NaN variance, min/max sizes the fork's int cannot hold (≥ 2^31,
NaN, inf), both img_size and img_h/img_w, both step and step_h/step_w, a NaN offset."""

from __future__ import annotations

import re

import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from tests import jitted

SHAPES = {"data": (1, 3, 10, 10), "feat": (1, 1, 2, 2)}


def _text(params: str) -> str:
    tops = "".join(f'top: "{k}" ' for k in SHAPES)
    shapes = "".join("shape { " + " ".join(f"dim: {d}" for d in s) + " } " for s in SHAPES.values())
    return (
        f'layer {{ name: "input" type: "Input" {tops} input_param {{ {shapes} }} }}\n'
        'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
        f"prior_box_param {{ {params} }} }}\n"
    )


@pytest.mark.parametrize(
    "params,why",
    [
        ("min_size: 4 img_h: 0 img_w: 10", r"img_h should be larger than 0"),
        ("min_size: 4 img_h: 10", r"img_w should be larger than 0"),
        ("min_size: 4 img_size: 0", r"img_size should be larger than 0"),
        ("min_size: 4 img_size: 10 img_h: 10 img_w: 10", r"Either img_size or img_h/img_w"),
        ("min_size: 4 step: nan", r"step should be larger than 0 and finite, got nan"),
        ("min_size: 4 step: inf", r"step should be larger than 0"),
        ("min_size: 4 step: 0", r"step should be larger than 0"),
        ("min_size: 4 step_h: nan step_w: 2", r"step_h should be larger than 0"),
        ("min_size: 4 step: 2 step_h: 2 step_w: 2", r"Either step or step_h/step_w"),
        ("min_size: 4 variance: nan", r"variance must be positive and finite"),
        ("min_size: 4 variance: 0.1 variance: 0.1 variance: nan variance: 0.2", r"variance"),
        ("min_size: 4294967296", r"min_size must be positive and below 2\^31"),
        ("min_size: 2147483648", r"min_size must be positive and below 2\^31"),
        ("min_size: nan", r"min_size must be positive"),
        ("min_size: inf", r"min_size must be positive"),
        ("min_size: 4 max_size: 1e12", r"max_size must be positive and below 2\^31"),
        ("min_size: 4 max_size: nan", r"max_size must be positive"),
        ("min_size: 4 offset: nan", r"offset must be finite"),
    ],
)
def test_priorbox_refuses_what_the_fork_checks(params, why):
    with pytest.raises(NetError, match=r"pb.*PriorBox|PriorBox.*pb") as error:
        caffe2jax.compile(_text(params))
    assert len(str(error.value).splitlines()) == 1
    assert re.search(why, str(error.value)), str(error.value)


def test_largest_int_size_is_still_accepted_and_finite():
    model = caffe2jax.compile(_text("min_size: 2147483520 step: 0.5 img_size: 7"))
    inputs = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    pb = np.asarray(jitted.forward(model, {}, {}, inputs)[0]["pb"])
    assert np.isfinite(pb).all()
