"""MyCaffe's record selection for the Data layer: label balancing and image boosting.

MyCaffe's image database selects inputs at random rather than in order. With *label balancing*
(``SettingsCaffe.EnableLabelBalancing``) it first picks a label uniformly among the labels that
have records, then a record of that label uniformly. With *image boosting* each image carries an
integer boost (``SimpleDatum.Boost``, stored by MyCaffe in its image table); when the
super-boost probability p is positive, each draw is, with probability p, made only among the
boosted images (boost > 0; within the chosen label when balancing, whose label is then picked
among the labels that have boosted images), and among all images otherwise. Draws are with
replacement. When no image is boosted, boosted draws fall back to ordinary ones, as MyCaffe's
query does.

In caffe2jax the options are ``DataParameter.enable_label_balancing`` and
``DataParameter.super_boost_probability``, and the boost lives in each record as
``Datum.boost`` (all MyCaffe extensions of caffe.proto, numbered from 1000).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class _Pool:
    """Record indices grouped by label: group g is ``order[starts[g] : starts[g] + counts[g]]``."""

    order: np.ndarray
    starts: np.ndarray
    counts: np.ndarray

    @classmethod
    def build(cls, members: np.ndarray, labels: np.ndarray, balance: bool) -> _Pool:
        if not balance:
            return cls(members, np.zeros(1, np.int64), np.array([len(members)]))
        order = members[np.argsort(labels[members], kind="stable")]
        _, starts, counts = np.unique(labels[order], return_index=True, return_counts=True)
        return cls(order, starts, counts)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        group = rng.integers(0, len(self.counts), n)
        offset = np.floor(rng.random(n) * self.counts[group]).astype(np.int64)
        return self.order[self.starts[group] + np.minimum(offset, self.counts[group] - 1)]


class Sampler:
    """Draws record indices with MyCaffe's label balancing and image boosting."""

    def __init__(
        self,
        labels: np.ndarray,
        boosts: np.ndarray,
        *,
        balance_labels: bool,
        super_boost_probability: float,
        rng: np.random.Generator,
    ) -> None:
        labels = np.asarray(labels, dtype=np.int64)
        if len(labels) == 0:
            raise ValueError("cannot sample from an empty data set")
        self.rng = rng
        self.p_boost = float(super_boost_probability)
        everyone = np.arange(len(labels))
        self.all = _Pool.build(everyone, labels, balance_labels)
        boosted = everyone[np.asarray(boosts) > 0]
        self.boosted = _Pool.build(boosted, labels, balance_labels) if len(boosted) else None

    def draw(self, n: int) -> np.ndarray:
        """``n`` record indices."""
        picks = self.all.draw(self.rng, n)
        if self.p_boost > 0 and self.boosted is not None:
            use_boost = self.rng.random(n) < self.p_boost
            if use_boost.any():
                picks[use_boost] = self.boosted.draw(self.rng, int(use_boost.sum()))
        return picks
