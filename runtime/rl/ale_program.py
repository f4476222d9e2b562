"""Atari batches as compiled programs: the emulators stepped from inside the rollout.

``rl_param { ale_rollout: "program" }`` (or ``--ale-rollout program``) with an ale-py that
exports no XLA custom calls (:mod:`.ale_ffi` runs it otherwise) plays a batch of Atari
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

Inside each step the emulator groups are pipelined as the loop overlaps them: a group's
forward, its emulators started on a host thread (one ``io_callback``), then the other group's
step collected (another) — so one group's emulators run while the other group's forward
computes; with one group the step is started and collected at once. The lanes' bookkeeping
(which episode each plays, its length, its sticky generator) lives on the host beside the
emulators, which it drives; the device carries each group's latest screens, previous
preprocessed frames and step in flight, the step counter and whether any lane still plays.
Each chunk returns its steps time-major (a second group's one row late); :func:`trajectory`
orders them by episode into the padded :class:`.rollout.Trajectory` the loop's batch gives.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
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
    drives them: :meth:`begin` resets every lane onto the batch's first episodes, :meth:`start`
    starts one agent step of a group's emulators on a thread, :meth:`finish` collects it and
    restarts the lanes whose episode ended."""

    def __init__(self, envs: AleEnvs, seed: int, horizon: int):
        self.envs, self.seed, self.horizon = envs, seed, horizon
        n = envs.settings.num_envs
        self.episode = np.full(n, -1, np.int64)
        self.length = np.zeros(n, np.int64)
        self.sticky: list[np.random.Generator | None] = [None] * n
        self.red = np.zeros((n, pixels.SIZE, pixels.SIZE), np.uint8)
        self.first = self.count = self.next = 0
        self.pending: list[tuple | None] = [None] * len(envs.groups)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="ale-program")

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
        self.pending = [None] * len(self.envs.groups)
        for g, sl in enumerate(self.envs.slices):
            self.red[sl] = self.envs.reset(g)
        return self.red.copy()

    def _uniforms(self, sl: slice) -> np.ndarray | None:
        frames = self.envs.settings.frameskip
        if self.envs.settings.repeat_action_probability == 0:
            return None
        idle = np.ones(frames)  # an idle lane keeps its action: nothing is recorded
        return np.stack([g.random(frames) if g is not None else idle for g in self.sticky[sl]])

    def start(self, g: int, action: np.ndarray) -> np.ndarray:
        """Start one agent step of group ``g`` on the emulator thread (not if none of its lanes
        plays); :meth:`finish` collects it."""
        sl = self.envs.slices[g]
        played = self.episode[sl].copy()
        job = None
        if (played >= 0).any():
            job = self.pool.submit(self.envs.step, g, np.asarray(action), self._uniforms(sl))
        self.pending[g] = (played, job)
        return np.int32(0)

    def finish(self, g: int) -> tuple:
        """Group ``g``'s started step, its ended lanes restarted: ``(screens, rewards, episode
        each lane played (-1: idle or nothing started), has a previous frame, absolute
        episode, any lane still playing or stepping)``."""
        sl = self.envs.slices[g]
        k = sl.stop - sl.start
        reward, ended = np.zeros(k, np.float32), np.zeros(k, np.bool_)
        played, job = self.pending[g] or (np.full(k, -1), None)
        self.pending[g] = None
        if job is not None:
            self.red[sl], reward, ended = job.result()
        self.length[sl] += played >= 0
        stop = (played >= 0) & (ended | ((self.horizon > 0) & (self.length[sl] >= self.horizon)))
        self._assign(sl.start + np.flatnonzero(stop))
        restart = stop & (self.episode[sl] >= 0)
        if restart.any():
            self.red[sl] = np.where(
                restart[:, None, None], self.envs.reset(g, restart), self.red[sl]
            )
        has_prev = ~stop & (played >= 0)  # nothing started (a batch's start): no previous frame
        absolute = (self.first + np.maximum(self.episode[sl], 0)).astype(np.int32)
        live = self.live or any(p is not None for p in self.pending)
        return (self.red[sl].copy(), reward, played.astype(np.int32), has_prev, absolute,
                np.bool_(live))  # fmt: skip


def _finish_shapes(k: int) -> tuple:
    return (
        jax.ShapeDtypeStruct((k, pixels.SIZE, pixels.SIZE), jnp.uint8),
        jax.ShapeDtypeStruct((k,), jnp.float32),
        jax.ShapeDtypeStruct((k,), jnp.int32),
        jax.ShapeDtypeStruct((k,), jnp.bool_),
        jax.ShapeDtypeStruct((k,), jnp.int32),
        jax.ShapeDtypeStruct((), jnp.bool_),
    )


def chunk_fn(trainer: PolicyGradientTrainer, lanes: Lanes, steps: int) -> Any:
    """``(params, state, key, carry) -> (carry, (stored x, probs, actions, rewards, played))``:
    ``steps`` agent steps of every lane, time-major, one XLA call (jit it).

    Each step pipelines the groups as the per-step loop does: group ``g``'s forward, its
    emulators started, then the next group's started step collected — so one group's
    emulators run while the other's forward computes. ``carry`` is ``(latest, prev, held,
    step, live)``: per group the latest ``(screens, has previous, absolute episode)``, the
    previous preprocessed frames, and the outputs of its step in flight."""
    act = act_fn(trainer)
    slices = lanes.envs.slices
    count = len(slices)

    def forward(params, state, key, latest, prev, t, g):
        red, has_prev, episode = latest[g]
        return act(params, state, red, prev[g], has_prev, key, t, np.int32(g), episode, False)

    def real(params, state, key, carry):
        latest, prev, held, t, _ = (list(c) if isinstance(c, tuple) else c for c in carry)
        outs, live = [None] * count, None
        for g in range(count):
            stored, probs, action, prev[g] = forward(params, state, key, latest, prev, t, g)
            io_callback(lanes.start, jax.ShapeDtypeStruct((), jnp.int32), g, action,
                        ordered=True)  # fmt: skip
            held[g], h = (stored, probs, action), (g + 1) % count
            k = slices[h].stop - slices[h].start
            red, reward, played, has_prev, episode, live = io_callback(
                lanes.finish, _finish_shapes(k), h, ordered=True
            )
            latest[h] = (red, has_prev, episode)
            outs[h] = (*held[h], reward, played)
        row = tuple(jnp.concatenate(parts) for parts in zip(*outs))
        return (tuple(latest), tuple(prev), tuple(held), t + 1, live), row

    def skip(params, state, key, carry):
        out = jax.eval_shape(lambda c: real(params, state, key, c)[1], carry)
        zeros = [jnp.zeros(o.shape, o.dtype) for o in out[:4]]
        return carry, (*zeros, jnp.full(out[4].shape, -1, jnp.int32))  # played: idle

    def run(params, state, key, carry):
        def body(c, _):
            return lax.cond(c[-1], real, skip, params, state, key, c)

        return lax.scan(body, carry, None, length=steps)

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


def _held_shapes(trainer: PolicyGradientTrainer, k: int) -> tuple:
    """The stored input, probabilities and actions of ``k`` lanes' step."""
    params, state = jax.eval_shape(trainer.model.init, jax.random.key(0))
    red = jax.ShapeDtypeStruct((k, pixels.SIZE, pixels.SIZE), jnp.uint8)
    prev = jax.ShapeDtypeStruct((k, pixels.SIZE * pixels.SIZE), jnp.float32)
    flags, ints = jax.ShapeDtypeStruct((k,), jnp.bool_), jax.ShapeDtypeStruct((k,), jnp.int32)
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    act = act_fn(trainer)
    out = jax.eval_shape(lambda *a: act(*a, False), params, state, red, prev, flags,
                         jax.random.key(0), scalar, scalar, ints)  # fmt: skip
    return out[:3]


class AleProgram:
    """Drives the Atari emulators from inside compiled rollouts (:class:`~.driver.EnvDriver`):
    ``batch_size`` episodes in chunks of ``rollout_chunk`` agent steps, then the trainer's
    jitted rule and ONE solver update."""

    def __init__(self, trainer: PolicyGradientTrainer):
        cfg = trainer.config
        self.trainer = trainer
        self.lanes = Lanes(trainer.ale, cfg.seed, cfg.horizon or 0)
        self.chunk = jax.jit(chunk_fn(trainer, self.lanes, cfg.rollout_chunk))
        self.held = [_held_shapes(trainer, sl.stop - sl.start) for sl in trainer.ale.slices]

    def play(self, params: Any, state: Any, key: jax.Array, first: int, count: int) -> tuple:
        """Episodes ``first .. first + count - 1``: ``(played, (stored x, probs, actions,
        rewards))``, every chunk's steps concatenated in time."""
        red = self.lanes.begin(first, count)
        episode = (first + np.maximum(self.lanes.episode, 0)).astype(np.int32)
        latest, prev, held = [], [], []
        for sl, shapes in zip(self.lanes.envs.slices, self.held):
            k = sl.stop - sl.start
            latest.append((red[sl], np.zeros(k, np.bool_), episode[sl]))
            prev.append(jnp.zeros((k, pixels.SIZE * pixels.SIZE), jnp.float32))
            held.append(tuple(jnp.zeros(s.shape, s.dtype) for s in shapes))
        carry = (tuple(latest), tuple(prev), tuple(held), np.int32(0), np.bool_(True))
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
