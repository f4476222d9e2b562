"""Atari batches as compiled programs whose emulators are XLA custom calls (ale-py's FFI).

``rl_param { ale_rollout: "program" }`` (with an ale-py that exports the custom calls, ≥ 0.12;
:func:`available`) plays the batch of :mod:`.ale_program` — the same episodes,
actions, rewards and stored inputs as the per-step loop (:mod:`.ale_loop`), hence the same
update (tested) — with no Python on the step path: ale-py (≥ 0.12) exports its vector env's
step and reset as XLA FFI targets (``atari_vector_xla_step`` / ``atari_vector_xla_reset``,
what ``AtariVectorEnv.xla()`` wraps), called here directly from the ``lax.scan`` of
``rollout_chunk`` agent steps. The env's handle is threaded through the scan as data, so XLA
keeps the calls in order.

What the host did for the io_callback program is done on the device:

* the lanes' bookkeeping (which episode each plays, its length; lane ``i`` takes the batch's
  next unplayed episode when its last ended or reached the ``horizon``, in lane order);
* sticky actions: the draws of each episode's generator (:func:`.ale_env.sticky_generator`)
  are made on the host before the batch, as a ``(batch_size, steps × frameskip)`` table of
  ``draw < p``, and looked up by (episode, step in the episode, frame); the frame skip is
  played frame by frame, each frame one custom call (one call per agent step without
  stickiness, the emulators skipping the frames);
* restarts: the lanes that take a new episode are reset by one reset call for exactly those
  lanes (a ``lax.switch`` on how many, as the call's index list has a static length).

The emulators are one ``AtariVectorEnv`` of all ``num_envs`` lanes with the settings and
``SameStep`` autoreset of :mod:`.ale_env` (``xla()`` insists on ``NextStep`` only for its own
wrappers; the custom calls step and reset the vectorizer as ``send``/``recv``/``reset`` do —
tested equal on every step). The overlap groups of :class:`.ale_env.AleEnvs` still define the
action draws (group ``g`` draws with ``fold_in(fold_in(key, step), g)``), so the actions are
the loop's; the emulators of all lanes step in one call. The custom calls are CPU targets, so
the rollout runs on the CPU device whatever the default device is (the update does not).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.runtime.rl import pixels
from caffe2jax.runtime.rl.ale_env import AleEnvs, sticky_generator, vector_env
from caffe2jax.runtime.rl.ale_loop import act_fn
from caffe2jax.runtime.rl.ale_program import AleProgram

if TYPE_CHECKING:
    from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer

STEP, RESET = "atari_vector_xla_step", "atari_vector_xla_reset"
_registered: list[bool] = []
HANDLE = jax.ShapeDtypeStruct((8,), jnp.uint8)  # the vectorizer's address


def available() -> bool:
    """Whether the installed ale-py exports its vector env's XLA custom calls."""
    try:
        import ale_py
    except ImportError:
        return False
    return hasattr(ale_py._ale_py, "VectorXLAStep") and hasattr(ale_py._ale_py, "VectorXLAReset")


def register() -> None:
    """Register ale-py's CPU custom calls with JAX (once per process)."""
    if _registered:
        return
    import ale_py

    jax.ffi.register_ffi_target(RESET, ale_py._ale_py.VectorXLAReset(), platform="cpu")
    jax.ffi.register_ffi_target(STEP, ale_py._ale_py.VectorXLAStep(), platform="cpu")
    _registered.append(True)


def crop(screens: jax.Array) -> jax.Array:
    """:func:`.pixels.crop` inside the program: ``(n, 1, 210, 160, 3)`` -> ``(n, 80, 80)``."""
    return screens[:, -1, pixels.CROP_TOP : pixels.CROP_BOTTOM : pixels.STRIDE, :: pixels.STRIDE, 0]


class Emulators:
    """One vector env of ``n`` lanes and its two custom calls, as functions of the handle."""

    def __init__(self, envs: AleEnvs):
        register()
        n = envs.settings.num_envs
        self.env = vector_env(envs.settings, n)
        self.handle = np.frombuffer(self.env.ale.handle(), np.uint8).copy()
        self.n, self.obs = n, jax.ShapeDtypeStruct(self.env.observation_space.shape, jnp.uint8)

    def _ints(self, dtype: Any = jnp.int32) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((self.n,), dtype)

    def step(self, handle: jax.Array, actions: jax.Array) -> tuple:
        """One step of every lane (ALE action ids): ``(handle, screens, rewards, ended)``."""
        i32, flag = self._ints(), self._ints(jnp.bool_)
        shapes = (HANDLE, self.obs, i32, flag, flag, i32, i32, i32, i32)
        call = jax.ffi.ffi_call(STEP, shapes, has_side_effect=True)
        out = call(handle, actions.astype(jnp.int32), jnp.ones(self.n, jnp.float32))
        return out[0], crop(out[1]), out[2].astype(jnp.float32), out[3] | out[4]

    def _reset(self, k: int) -> Any:
        i32 = self._ints()
        shapes = (HANDLE, self.obs, i32, i32, i32, i32)
        call = jax.ffi.ffi_call(RESET, shapes, has_side_effect=True)

        def reset(handle, indices, red):
            out = call(handle, indices[:k], jnp.full(k, -1, jnp.int32))
            return out[0], crop(out[1])

        return reset

    def reset(self, handle: jax.Array, mask: jax.Array, red: jax.Array) -> tuple:
        """Reset the lanes in ``mask`` (none: no call): ``(handle, screens)``, the others'
        screens kept."""

        def none(handle, indices, red):
            return handle, red

        indices = jnp.nonzero(mask, size=self.n, fill_value=0)[0].astype(jnp.int32)
        branches = [none] + [self._reset(k) for k in range(1, self.n + 1)]
        handle, screens = lax.switch(mask.sum(), branches, handle, indices, red)
        return handle, jnp.where(mask[:, None, None], screens, red)

    def close(self) -> None:
        self.env.close()


class Carry(NamedTuple):
    """The rollout's state between steps and chunks, all on the device."""

    handle: jax.Array  # the vector env's handle: orders the custom calls
    red: jax.Array  # (n, 80, 80) each lane's latest screen
    prev: jax.Array  # (n, 6400) its previous preprocessed frame
    has_prev: jax.Array  # (n,) whether it has one
    episode: jax.Array  # (n,) the batch's episode each lane plays (-1: idle)
    length: jax.Array  # (n,) its agent steps so far
    applied: jax.Array  # (n,) the action each emulator applies now (sticky actions)
    next: jax.Array  # the batch's next unplayed episode
    first: jax.Array  # the batch's first episode (absolute)
    t: jax.Array  # agent steps so far
    live: jax.Array  # whether any lane still plays


def sticky_table(envs: AleEnvs, seed: int, first: int, count: int, horizon: int) -> np.ndarray:
    """``(count, steps × frameskip)``: where each episode's sticky draws are below ``p`` (the
    draws :meth:`.ale_program.Lanes` makes step by step, in the same order)."""
    s = envs.settings
    steps = horizon if horizon > 0 else -(-s.max_frames // s.frameskip) + 1
    if s.repeat_action_probability == 0:
        return np.zeros((count, 1), np.bool_)
    draws = [sticky_generator(seed, first + e).random(steps * s.frameskip) for e in range(count)]
    return np.stack(draws) < s.repeat_action_probability


def _emulate(emu: Emulators, envs: AleEnvs, c: Carry, action: jax.Array, table: jax.Array):
    """One agent step of every lane's emulator: the frame skip played frame by frame with
    sticky actions (:meth:`.ale_env.AleEnvs.step`), or one call without stickiness."""
    s = envs.settings
    wanted = jnp.asarray(envs.action_ids)[action]
    if s.repeat_action_probability == 0:
        handle, red, reward, ended = emu.step(c.handle, wanted)
        return handle, red, reward, ended, c.applied
    handle, applied = c.handle, c.applied
    total, ended = jnp.zeros(emu.n, jnp.float32), jnp.zeros(emu.n, jnp.bool_)
    row = jnp.maximum(c.episode, 0)
    for f in range(s.frameskip):
        col = jnp.minimum(c.length * s.frameskip + f, table.shape[1] - 1)
        sticky = table[row, col] & (c.episode >= 0)  # an idle lane never sticks
        applied = jnp.where(sticky, applied, wanted)
        handle, red, reward, done = emu.step(handle, applied)
        total = total + jnp.where(ended, 0.0, reward)
        ended = ended | done
    return handle, red, total, ended, applied


def _assign(c: Carry, stop: jax.Array, count: int) -> tuple[jax.Array, jax.Array]:
    """The lanes in ``stop`` take the batch's next episodes in lane order (-1: none left)."""
    rank = jnp.cumsum(stop) - 1
    new = c.next + rank
    episode = jnp.where(stop, jnp.where(new < count, new, -1), c.episode)
    return episode.astype(jnp.int32), c.next + stop.sum().astype(jnp.int32)


def chunk_fn(trainer: PolicyGradientTrainer, emu: Emulators, steps: int) -> Any:
    """``(params, state, key, table, horizon, carry) -> (carry, (stored x, probs, actions,
    rewards, played))``: ``steps`` agent steps of every lane, time-major, one XLA call (jit
    it); the steps after the batch's last episode ended are skipped (``lax.cond``)."""
    act, envs = act_fn(trainer), trainer.ale

    def forward(params, state, key, c: Carry) -> list:
        absolute = c.first + jnp.maximum(c.episode, 0)
        parts = [act(params, state, c.red[sl], c.prev[sl], c.has_prev[sl], key, c.t,
                     np.int32(g), absolute[sl], False)
                 for g, sl in enumerate(envs.slices)]  # fmt: skip
        return [jnp.concatenate(p) for p in zip(*parts)]

    def real(params, state, key, table, horizon, c: Carry):
        stored, probs, action, cur = forward(params, state, key, c)
        handle, red, reward, ended, applied = _emulate(emu, envs, c, action, table)
        played = c.episode
        length = c.length + (played >= 0)
        stop = (played >= 0) & (ended | ((horizon > 0) & (length >= horizon)))
        episode, nxt = _assign(c, stop, table.shape[0])
        restart = stop & (episode >= 0)
        handle, red = emu.reset(handle, restart, red)
        c = Carry(handle, red, cur, ~stop & (played >= 0), episode, jnp.where(stop, 0, length),
                  jnp.where(restart, envs.noop, applied).astype(jnp.int32), nxt, c.first,
                  c.t + 1, (episode >= 0).any())  # fmt: skip
        return c, (stored, probs, action, reward, played)

    def skip(params, state, key, table, horizon, c: Carry):
        out = jax.eval_shape(lambda c: real(params, state, key, table, horizon, c)[1], c)
        zeros = [jnp.zeros(o.shape, o.dtype) for o in out[:4]]
        return c, (*zeros, jnp.full(out[4].shape, -1, jnp.int32))  # played: idle

    def run(params, state, key, table, horizon, carry):
        def body(c, _):
            return lax.cond(c.live, real, skip, params, state, key, table, horizon, c)

        return lax.scan(body, carry, None, length=steps)

    return run


class AleFfi(AleProgram):
    """:class:`.ale_program.AleProgram`'s batches with the emulators as custom calls: the
    rollout runs from the batch's reset to its last step without Python."""

    def __init__(self, trainer: PolicyGradientTrainer):
        cfg, n = trainer.config, trainer.ale.settings.num_envs
        self.trainer, self.horizon = trainer, cfg.horizon or 0
        self.emu = Emulators(trainer.ale)
        self.chunk = jax.jit(chunk_fn(trainer, self.emu, cfg.rollout_chunk))
        blank = np.zeros((n, pixels.SIZE, pixels.SIZE), np.uint8)
        self.begin = jax.jit(lambda h: self.emu.reset(h, np.ones(n, np.bool_), blank))

    def carry(self, first: int, count: int) -> Carry:
        """Every lane reset onto the batch's first episodes, in lane order."""
        n, noop = self.emu.n, self.trainer.ale.noop
        handle, red = self.begin(self.emu.handle)
        lanes = np.arange(n, dtype=np.int32)
        return Carry(handle, red, jnp.zeros((n, pixels.SIZE * pixels.SIZE), jnp.float32),
                     jnp.zeros(n, jnp.bool_), jnp.asarray(np.where(lanes < count, lanes, -1)),
                     jnp.zeros(n, jnp.int32), jnp.full(n, noop, jnp.int32), jnp.int32(n),
                     jnp.int32(first), jnp.int32(0), jnp.bool_(True))  # fmt: skip

    def play(self, params: Any, state: Any, key: jax.Array, first: int, count: int) -> tuple:
        """Episodes ``first .. first + count - 1``: ``(played, (stored x, probs, actions,
        rewards))``, every chunk's steps concatenated in time."""
        cfg, cpu = self.trainer.config, jax.devices("cpu")[0]
        params, state, key = jax.device_put((params, state, key), cpu)
        with jax.default_device(cpu):  # the custom calls' platform
            table = sticky_table(self.trainer.ale, cfg.seed, first, count, self.horizon)
            carry, chunks, horizon = self.carry(first, count), [], jnp.int32(self.horizon)
            table = jnp.asarray(table)
            while bool(carry.live):
                carry, out = self.chunk(params, state, key, table, horizon, carry)
                chunks.append(jax.device_get(out))
        stored, probs, actions, rewards, played = (np.concatenate(p) for p in zip(*chunks))
        return played, (stored, probs, actions, rewards)
