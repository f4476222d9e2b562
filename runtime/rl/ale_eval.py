"""Running a trained policy on Atari without learning (``caffe2jax rl --test`` on ``ALE/…``).

The episodes are played by the per-step loop (:meth:`.ale_loop.AleLoop.play`) — the
same emulators, preprocessing and action draw as training — greedily (the most probable
action) or sampled as MyCaffe's ``Brain.act`` draws; episode ``k`` uses the sticky-action
generator of the test seed and ``k``. The screens of the first episode can be kept for a GIF
(:func:`.render.write_screens`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import numpy as np

from caffe2jax.lowering.graph import Params
from caffe2jax.runtime.rl.ale_loop import AleLoop
from caffe2jax.runtime.rl.evaluate import EvalResult

if TYPE_CHECKING:
    from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer


def evaluate(
    trainer: PolicyGradientTrainer,
    params: Params,
    state: Params,
    episodes: int = 100,
    greedy: bool = True,
    seed: int = 0,
    frames: int = 0,
) -> tuple[EvalResult, list[np.ndarray]]:
    """Play ``episodes`` episodes; the result and up to ``frames`` RGB screens of the first."""
    screens: list[np.ndarray] = []

    def keep(group: int, episode: np.ndarray, obs: np.ndarray) -> None:
        if group == 0 and episode[0] == 0 and len(screens) < frames:
            screens.append(np.array(obs[0, -1] if obs.ndim == 5 else obs[0]))

    loop = trainer.driver if isinstance(trainer.driver, AleLoop) else AleLoop(trainer)
    played = loop.play(params, state, jax.random.key(seed), 0, episodes,
                       greedy=greedy, record=False, on_screen=keep)  # fmt: skip
    lengths = played.steps.astype(np.int64)
    horizon = trainer.config.horizon or 0
    truncated = int(np.sum(lengths >= horizon)) if horizon else 0
    return EvalResult(np.asarray(played.returns), lengths, horizon, truncated), screens
