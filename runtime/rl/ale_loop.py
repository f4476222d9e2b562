"""Atari batches: many emulators stepped at once, one jitted forward for all of them.

A batch is ``batch_size`` episodes, all played with the same params (MyCaffe trains
``batch_size`` episodes between updates). The ``num_envs`` emulators are lanes: lane ``i``
plays the batch's next unplayed episode whenever its last one ended, so up to ``num_envs``
episodes run side by side; a lane with nothing left to play idles until the batch ends.
Every episode starts from a reset, and its sticky actions are drawn from a generator keyed by
the run's seed and the episode's index (:mod:`.ale_env`), so a batch is a function of the
params, the PRNG key and the episode counter alone.

Each step of a group of lanes is one jitted call — preprocessing (:mod:`.pixels`), the policy's
forward for every lane of the group, MyCaffe's action draw (``Brain.act``) — and one step of
ale-py's vector env. With ``overlap`` the lanes form two groups and the loop alternates: a
group's forward is dispatched (JAX runs it asynchronously) and the other group's emulators
step while it computes. The order of the calls is fixed, so a batch does not depend on which
finishes first.

Once every episode of the batch has ended, the padded trajectory (inputs packed as bit planes,
:func:`pixels.pack_difference`) goes through the trainer's jitted rule and ONE solver update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.runtime.rl import pixels, rule
from caffe2jax.runtime.rl.ale_env import AleEnvs, sticky_generator
from caffe2jax.runtime.rl.evaluate import greedy_probs
from caffe2jax.runtime.rl.policy import SIGMOID, RLError
from caffe2jax.runtime.rl.rollout import Trajectory, explore, sample
from caffe2jax.runtime.rl.state import BatchMetrics, PolicyState, episode_metrics

if TYPE_CHECKING:
    from caffe2jax.runtime.rl.config import RLConfig
    from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer

OnScreen = Callable[[int, np.ndarray, np.ndarray], None]  # (group, episode per lane, screens)


def open_env(config: RLConfig) -> AleEnvs:
    try:
        return AleEnvs(config.ale_settings())
    except (ImportError, ValueError) as err:
        raise RLError(str(err)) from None


def decoder(config: RLConfig) -> Callable[[jax.Array], jax.Array]:
    """Rows of stored inputs -> the net's inputs (unpacks the bit planes of binary frames)."""
    size = pixels.SIZE * pixels.SIZE
    if not config.preprocess:
        return lambda x: x
    return lambda x: pixels.unpack_difference(x.reshape(x.shape[0], 2, -1), size)


def act_fn(trainer: PolicyGradientTrainer) -> Any:
    """``(params, state, red, prev, has_prev, key, step, group, episode, greedy) ->
    (stored x, probs, action, cur)`` for one group of lanes (the draw's key is ``key`` folded
    with the group's step and the group)."""
    policy, cfg = trainer.policy, trainer.config
    spec = policy.spec

    def act(params, state, red, prev, has_prev, key, step, group, episode, greedy):
        n = red.shape[0]
        key = jax.random.fold_in(jax.random.fold_in(key, step), group)
        cur = (pixels.binarise(red) if cfg.preprocess else pixels.scale(red)).reshape(n, -1)
        x = pixels.difference(cur, prev, has_prev) if cfg.difference_input else cur
        probs = policy.forward(params, state, x)[0]
        if greedy:
            probs = greedy_probs(spec.kind, probs)
        u = jax.random.uniform(key, (n,), jnp.float32)
        action = sample(spec.kind, probs, u)
        if cfg.eps_steps > 0 and not greedy:
            eps = rule.epsilon(episode, cfg.eps_steps, cfg.eps_start, cfg.eps_end)
            u_eps = jax.random.uniform(jax.random.fold_in(key, 1), (n, 2))
            probs, action = explore(spec.kind, probs, action, eps, u_eps)
        stored = pixels.pack_difference(x) if cfg.preprocess else x
        return stored, probs, action, cur

    return act


@dataclass
class Played:
    """What :func:`play` played: per episode (in index order) its steps and its return."""

    x: list[list[np.ndarray]]
    actions: list[list[int]]
    probs: list[list[np.ndarray]]
    rewards: list[list[float]]
    returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def lengths(self) -> np.ndarray:
        return np.asarray([len(a) for a in self.actions], np.int32)


class _Book:
    """Which episode each lane plays, and what each episode recorded."""

    def __init__(self, count: int, lanes: int, record: bool):
        self.count, self.next, self.record = count, 0, record
        self.episode = np.full(lanes, -1)
        self.length = np.zeros(lanes, np.int64)
        self.has_prev = np.zeros(lanes, np.bool_)
        self.played = Played([[] for _ in range(count)], [[] for _ in range(count)],
                             [[] for _ in range(count)], [[] for _ in range(count)])  # fmt: skip
        self.sums = np.zeros(count)
        self.steps = np.zeros(count, np.int64)

    def assign(self, lanes: np.ndarray) -> np.ndarray:
        """Give each lane the next unplayed episode (-1: none left)."""
        for lane in lanes:
            self.episode[lane] = self.next if self.next < self.count else -1
            self.next += 1
        self.length[lanes] = 0
        self.has_prev[lanes] = False
        return self.episode[lanes]

    def add(self, lanes: range, step: tuple, reward: np.ndarray) -> None:
        x, probs, action = step
        for j, lane in enumerate(lanes):
            e = self.episode[lane]
            if e < 0:
                continue
            self.sums[e] += reward[j]
            self.steps[e] += 1
            self.length[lane] += 1
            if self.record:
                p = self.played
                p.x[e].append(x[j])
                p.actions[e].append(int(action[j]))
                p.probs[e].append(probs[j])
                p.rewards[e].append(float(reward[j]))


class _Runner:
    """One :func:`play`: the emulator groups, each group's device memory of the previous
    frame, its forward in flight, and each lane's sticky-action generator."""

    def __init__(self, driver, params, state, key, first, book, greedy, on_screen):
        self.envs, self.cfg, self.act = driver.envs, driver.trainer.config, driver.act
        self.params, self.state, self.key, self.first = params, state, key, first
        self.book, self.greedy, self.on_screen = book, greedy, on_screen
        groups = len(self.envs.groups)
        self.prev: list[Any] = [None] * groups
        self.out: list[Any] = [None] * groups
        self.steps = [0] * groups
        self.sticky: list[np.random.Generator | None] = [None] * self.cfg.num_envs
        self.frames = self.envs.settings.frameskip

    def _show(self, g: int) -> None:
        if self.on_screen is not None:
            sl = self.envs.slices[g]
            self.on_screen(g, self.book.episode[sl].copy(), self.envs.screens[g])

    def _begin(self, lanes: np.ndarray) -> None:
        """Give the lanes their next episodes, each with its own sticky-action generator."""
        for lane, e in zip(lanes, self.book.assign(lanes)):
            self.sticky[lane] = sticky_generator(self.cfg.seed, self.first + e) if e >= 0 else None

    def start(self, g: int) -> None:
        """Reset the group's lanes onto the batch's first episodes; dispatch their forward."""
        sl = self.envs.slices[g]
        lanes = np.arange(sl.start, sl.stop)
        self._begin(lanes)
        red = self.envs.reset(g)
        self.prev[g] = jnp.zeros((len(lanes), red[0].size), jnp.float32)
        self._show(g)
        self.dispatch(g, red)

    def dispatch(self, g: int, red: np.ndarray) -> None:
        """The group's jitted forward and action draw, not awaited: it computes while the
        next group's emulators step."""
        sl, book = self.envs.slices[g], self.book
        episode = (self.first + np.maximum(book.episode[sl], 0)).astype(np.int32)
        # a copy: JAX may read a NumPy input in place after this returns (async dispatch),
        # and the book's array changes before then
        has_prev = book.has_prev[sl].copy()
        out = self.act(self.params, self.state, red, self.prev[g], has_prev, self.key,
                       np.int32(self.steps[g]), np.int32(g), episode, self.greedy)  # fmt: skip
        self.prev[g], self.out[g] = out[3], out[:3]
        book.has_prev[sl] = True
        self.steps[g] += 1

    def _uniforms(self, sl: slice) -> np.ndarray | None:
        if self.envs.settings.repeat_action_probability == 0:
            return None
        idle = np.ones(self.frames)  # an idle lane keeps its action: nothing is recorded
        return np.stack([g.random(self.frames) if g is not None else idle
                         for g in self.sticky[sl]])  # fmt: skip

    def advance(self, g: int) -> bool:
        """Take the group's actions, step its emulators, record the step, restart the lanes
        whose episode ended and dispatch the next forward; False once none of its lanes has
        an episode left."""
        sl, book, horizon = self.envs.slices[g], self.book, self.cfg.horizon or 0
        x, probs, action = jax.device_get(self.out[g])
        red, reward, ended = self.envs.step(g, action, self._uniforms(sl))
        self._show(g)
        book.add(range(sl.start, sl.stop), (x, probs, action), reward)
        lanes = np.arange(sl.start, sl.stop)
        stop = ended | ((horizon > 0) & (book.length[sl] >= horizon))
        done = lanes[(book.episode[sl] >= 0) & stop]
        if len(done):
            self._begin(done)
            mask = np.isin(lanes, done) & (book.episode[sl] >= 0)  # idle lanes: no reset
            if mask.any():
                red = np.where(mask[:, None, None], self.envs.reset(g, mask), red)
                self._show(g)
        if not (book.episode[sl] >= 0).any():
            return False
        self.dispatch(g, red)
        return True


def bucket(steps: int) -> int:
    """Trajectory lengths: multiples of 64 (the learn chunk) on a 1, 1.25, 1.5, 1.75 × 2^m
    grid, so the update compiles once per bucket and pads at most 25%."""
    if steps <= 256:
        return max(64, -(-steps // 64) * 64)
    top = 1 << (steps - 1).bit_length()
    for size in (top // 2 + top // 8, top // 2 + top // 4, top // 2 + 3 * top // 8, top):
        if size >= steps:
            return size
    return top


def trajectory(played: Played, k: int) -> Trajectory:
    """The batch, time-major and padded: inputs as stored, actions, probs, rewards, mask."""
    count = len(played.actions)
    length = bucket(int(played.lengths.max()))
    row = np.asarray(played.x[0][0])
    x = np.zeros((length, count, *row.shape), row.dtype)
    actions = np.zeros((length, count), np.int32)
    probs = np.zeros((length, count, k), np.float32)
    rewards = np.zeros((length, count), np.float32)
    mask = np.zeros((length, count), np.float32)
    for e in range(count):
        n = len(played.actions[e])
        x[:n, e] = np.stack(played.x[e])
        actions[:n, e] = played.actions[e]
        probs[:n, e] = np.stack(played.probs[e])
        rewards[:n, e] = played.rewards[e]
        mask[:n, e] = 1.0
    return Trajectory(*(jnp.asarray(a) for a in (x, actions, probs, rewards, mask)))


class AleLoop:
    """Drives the Atari emulators for a trainer (:class:`~.driver.EnvDriver`): training
    batches, and :meth:`play` for evaluation (:mod:`.ale_eval`)."""

    def __init__(self, trainer: PolicyGradientTrainer):
        self.trainer = trainer
        self.envs = trainer.ale
        self.act = jax.jit(act_fn(trainer), static_argnames="greedy")

    def play(
        self,
        params: Any,
        state: Any,
        key: jax.Array,
        first: int,
        count: int,
        *,
        greedy: bool = False,
        record: bool = True,
        on_screen: OnScreen | None = None,
    ) -> Played:
        """Play episodes ``first .. first + count - 1`` of the run on the emulators;
        ``on_screen`` sees every group's RGB screens with the episode each lane plays (-1:
        idle)."""
        book = _Book(count, self.trainer.config.num_envs, record)
        runner = _Runner(self, params, state, key, first, book, greedy, on_screen)
        for g in range(len(runner.envs.groups)):
            runner.start(g)
        live = [True] * len(runner.envs.groups)
        while any(live):
            for g in range(len(live)):
                if live[g]:
                    live[g] = runner.advance(g)
        book.played.returns, book.played.steps = book.sums, book.steps
        return book.played

    def train_batch(self, ts: PolicyState) -> tuple[PolicyState, BatchMetrics]:
        """``batch_size`` Atari episodes, then the jitted rule and ONE solver update."""
        trainer = self.trainer
        cfg, spec = trainer.config, trainer.policy.spec
        key, k_play = jax.random.split(ts.key)
        first = int(ts.lanes.episodes)
        played = self.play(ts.params, ts.state, k_play, first, cfg.batch_size)
        traj = trajectory(played, 1 if spec.kind == SIGMOID else spec.num_actions)
        params, opt_state = trainer.learn(ts.params, ts.state, ts.opt_state, traj)
        lanes = ts.lanes.replace(episodes=ts.lanes.episodes + cfg.batch_size)
        return PolicyState(params, ts.state, opt_state, key, lanes), episode_metrics(traj)
