"""Atari batches as compiled programs: the emulators stepped from inside the rollout.

``rl_param { ale_rollout: "program" }`` (or ``--ale-rollout program``) plays a batch of Atari
episodes as a chain of XLA calls of ``rollout_chunk`` agent steps each: one ``jax.jit`` of a
``lax.scan`` whose step preprocesses every lane's screen (:mod:`.pixels`), runs the policy,
draws the actions and steps ale-py's vector env through an ordered
``jax.experimental.io_callback``. Episodes have no known length, so the batch is complete
when every lane has ended its last episode: the callback reports it, the remaining steps of
the chunk are skipped (``lax.cond``), and the host starts no further chunk.

The batch is the one the per-step loop (:mod:`.ale_loop`, ``ale_rollout: "steps"``) plays
for the same params, key and episode counter — same episodes, same actions, rewards and
stored inputs, hence the same update (tested):

* lanes take the batch's episodes in lane order, lane ``i`` the next unplayed one whenever
  its last ended (or reached the ``horizon``); a lane with none left idles, its steps not
  recorded;
* each group of lanes (:class:`.ale_env.AleEnvs`' one or two groups) draws its actions with
  the key of the loop's call for that group, ``fold_in(fold_in(key, step), group)``, through
  the same function (:func:`.ale_loop.act_fn`);
* sticky actions are drawn on the host from each episode's generator
  (:func:`.ale_env.sticky_generator`), one ``frameskip`` row per step;
* a restarted lane's first input is zero (Karpathy's ``prev_x = None``).

The lanes' bookkeeping (which episode each plays, its length, its sticky generator) lives on
the host beside the emulators, which it drives; the device carries the screens, the previous
preprocessed frames, the step counter and whether any lane still plays. Each chunk returns its
steps time-major; :func:`trajectory` orders them by episode into the padded
:class:`.rollout.Trajectory` the loop's batch would give.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

from caffe2jax.runtime.rl import pixels
from caffe2jax.runtime.rl.ale_env import AleEnvs, sticky_generator
from caffe2jax.runtime.rl.ale_loop import act_fn, bucket
from caffe2jax.runtime.rl.rollout import Trajectory
from caffe2jax.runtime.rl.state import BatchMetrics, PolicyState, episode_metrics

if TYPE_CHECKING:
    from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer


class Lanes:
    """The emulators and the lanes' bookkeeping for one batch, as the program's callback
    drives them: :meth:`begin` resets every lane onto the batch's first episodes, :meth:`step`
    takes one agent step of every lane and restarts the lanes whose episode ended."""

    def __init__(self, envs: AleEnvs, seed: int, horizon: int):
        self.envs, self.seed, self.horizon = envs, seed, horizon
        n = envs.settings.num_envs
        self.episode = np.full(n, -1, np.int64)
        self.length = np.zeros(n, np.int64)
        self.sticky: list[np.random.Generator | None] = [None] * n
        self.red = np.zeros((n, pixels.SIZE, pixels.SIZE), np.uint8)
        self.first = self.count = self.next = 0

    @property
    def live(self) -> bool:
        return bool((self.episode >= 0).any())

    def _assign(self, lanes: np.ndarray) -> None:
        """Each of ``lanes`` (in order) takes the batch's next unplayed episode (-1: none)."""
        for lane in lanes:
            e = self.next if self.next < self.count else -1
            self.episode[lane], self.next = e, self.next + 1
            self.sticky[lane] = sticky_generator(self.seed, self.first + e) if e >= 0 else None
        self.length[lanes] = 0

    def begin(self, first: int, count: int) -> np.ndarray:
        """Episodes ``first .. first + count - 1``: every lane reset; the screens."""
        self.first, self.count, self.next = first, count, 0
        self._assign(np.arange(len(self.episode)))
        for g, sl in enumerate(self.envs.slices):
            self.red[sl] = self.envs.reset(g)
        return self.red.copy()

    def _uniforms(self, sl: slice) -> np.ndarray | None:
        frames = self.envs.settings.frameskip
        if self.envs.settings.repeat_action_probability == 0:
            return None
        idle = np.ones(frames)  # an idle lane keeps its action: nothing is recorded
        return np.stack([g.random(frames) if g is not None else idle for g in self.sticky[sl]])

    def step(self, action: np.ndarray) -> tuple:
        """One agent step of every group with a lane still playing: ``(screens, rewards,
        episode each lane played (-1: idle), has a previous frame, absolute episode, live)``."""
        n = len(self.episode)
        reward, ended = np.zeros(n, np.float32), np.zeros(n, np.bool_)
        played = self.episode.copy()
        slices = self.envs.slices
        live = [g for g, sl in enumerate(slices) if (played[sl] >= 0).any()]
        steps = [(action[slices[g]], self._uniforms(slices[g])) for g in live]
        for g, out in zip(live, self.envs.step_groups(live, steps)):
            self.red[slices[g]], reward[slices[g]], ended[slices[g]] = out
        self.length += played >= 0
        stop = (played >= 0) & (ended | ((self.horizon > 0) & (self.length >= self.horizon)))
        self._assign(np.flatnonzero(stop))
        restart = stop & (self.episode >= 0)
        for g, sl in enumerate(self.envs.slices):
            if restart[sl].any():
                self.red[sl] = np.where(
                    restart[sl, None, None], self.envs.reset(g, restart[sl]), self.red[sl]
                )
        absolute = self.first + np.maximum(self.episode, 0)
        return (self.red.copy(), reward, played.astype(np.int32), ~stop,
                absolute.astype(np.int32), np.bool_(self.live))  # fmt: skip


def _out_shapes(n: int) -> tuple:
    return (
        jax.ShapeDtypeStruct((n, pixels.SIZE, pixels.SIZE), jnp.uint8),
        jax.ShapeDtypeStruct((n,), jnp.float32),
        jax.ShapeDtypeStruct((n,), jnp.int32),
        jax.ShapeDtypeStruct((n,), jnp.bool_),
        jax.ShapeDtypeStruct((n,), jnp.int32),
        jax.ShapeDtypeStruct((), jnp.bool_),
    )


def chunk_fn(trainer: PolicyGradientTrainer, lanes: Lanes, steps: int) -> Any:
    """``(params, state, key, carry) -> (carry, (stored x, probs, actions, rewards, played))``:
    ``steps`` agent steps of every lane, time-major, one XLA call (jit it). ``carry`` is
    ``(screens, previous frames, has previous, absolute episode, step, live)``."""
    act = act_fn(trainer)
    slices, n = lanes.envs.slices, trainer.config.num_envs
    shapes = _out_shapes(n)

    def forward(params, state, key, carry):
        red, prev, has_prev, episode, t, _ = carry
        groups = [act(params, state, red[sl], prev[sl], has_prev[sl], key, t, np.int32(g),
                      episode[sl], False) for g, sl in enumerate(slices)]  # fmt: skip
        return tuple(jnp.concatenate(parts) for parts in zip(*groups))

    def real(params, state, key, carry):
        stored, probs, action, cur = forward(params, state, key, carry)
        red, reward, played, has_prev, episode, live = io_callback(
            lanes.step, shapes, action, ordered=True
        )
        t = carry[4] + 1
        return (red, cur, has_prev, episode, t, live), (stored, probs, action, reward, played)

    def skip(params, state, key, carry):
        stored, probs, action, _ = jax.eval_shape(forward, params, state, key, carry)
        zeros = tuple(jnp.zeros(s.shape, s.dtype) for s in (stored, probs, action, shapes[1]))
        return carry, (*zeros, jnp.full(shapes[2].shape, -1, jnp.int32))  # played: idle

    def body(args, carry, _):
        return lax.cond(carry[-1], real, skip, *args, carry)

    def run(params, state, key, carry):
        return lax.scan(lambda c, i: body((params, state, key), c, i), carry, None, length=steps)

    return run


def trajectory(played: np.ndarray, steps: tuple, count: int) -> Trajectory:
    """The chunks' steps (``played``: ``(T, n)`` episode per lane and step, -1 idle; ``steps``:
    stored x, probs, actions, rewards, each ``(T, n, ...)``) -> the batch of ``count``
    episodes, time-major and padded as :func:`.ale_loop.trajectory` pads it."""
    t_idx, lane = np.nonzero(played >= 0)  # time order within each lane and episode
    episode = played[t_idx, lane]
    order = np.argsort(episode, kind="stable")
    episode, t_idx, lane = episode[order], t_idx[order], lane[order]
    lengths = np.bincount(episode, minlength=count)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pos = np.arange(len(episode)) - starts[episode]
    length = bucket(int(lengths.max()))
    x, probs, actions, rewards = steps
    out = []
    for values, dtype in ((x, x.dtype), (actions, np.int32), (probs, np.float32),
                          (rewards, np.float32)):  # fmt: skip
        full = np.zeros((length, count, *values.shape[2:]), dtype)
        full[pos, episode] = values[t_idx, lane]
        out.append(full)
    mask = np.zeros((length, count), np.float32)
    mask[pos, episode] = 1.0
    return Trajectory(*(jnp.asarray(a) for a in (*out, mask)))


class AleProgram:
    """Drives the Atari emulators from inside compiled rollouts (:class:`~.driver.EnvDriver`):
    ``batch_size`` episodes in chunks of ``rollout_chunk`` agent steps, then the trainer's
    jitted rule and ONE solver update."""

    def __init__(self, trainer: PolicyGradientTrainer):
        cfg = trainer.config
        self.trainer = trainer
        self.lanes = Lanes(trainer.ale, cfg.seed, cfg.horizon or 0)
        self.chunk = jax.jit(chunk_fn(trainer, self.lanes, cfg.rollout_chunk))

    def play(self, params: Any, state: Any, key: jax.Array, first: int, count: int) -> tuple:
        """Episodes ``first .. first + count - 1``: ``(played, (stored x, probs, actions,
        rewards))``, every chunk's steps concatenated in time."""
        n = self.trainer.config.num_envs
        red = self.lanes.begin(first, count)
        episode = (first + np.maximum(self.lanes.episode, 0)).astype(np.int32)
        prev = jnp.zeros((n, pixels.SIZE * pixels.SIZE), jnp.float32)
        carry = (red, prev, np.zeros(n, np.bool_), episode, np.int32(0), np.bool_(True))
        chunks = []
        while self.lanes.live:
            carry, out = self.chunk(params, state, key, carry)
            chunks.append(jax.device_get(out))
        stored, probs, actions, rewards, played = (np.concatenate(p) for p in zip(*chunks))
        return played, (stored, probs, actions, rewards)

    def train_batch(self, ts: PolicyState) -> tuple[PolicyState, BatchMetrics]:
        """``batch_size`` Atari episodes, then the jitted rule and ONE solver update (the
        loop's key split and episode counter: the same batch as :class:`.ale_loop.AleLoop`)."""
        trainer = self.trainer
        cfg = trainer.config
        key, k_play = jax.random.split(ts.key)
        played, steps = self.play(ts.params, ts.state, k_play, int(ts.lanes.episodes),
                                  cfg.batch_size)  # fmt: skip
        traj = trajectory(played, steps, cfg.batch_size)
        params, opt_state = trainer.learn(ts.params, ts.state, ts.opt_state, traj)
        lanes = ts.lanes.replace(episodes=ts.lanes.episodes + cfg.batch_size)
        return PolicyState(params, ts.state, opt_state, key, lanes), episode_metrics(traj)
