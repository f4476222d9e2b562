"""The RL trainer's update rule as a configuration entry: ``rl_param { update { ... } }``.

TensorForce 0.3's point, that the optimizer is part of the graph and a configuration entry,
on Caffe's solver prototxt. Three rules, each a pure function over the params, the batch of
episodes and the solver state, the whole update one XLA program (:mod:`.learners`):

* ``PG`` (the default, unset ``update``): MyCaffe's policy gradient (:mod:`.rule`) through the
  solver's ApplyUpdate, bit for bit as without the entry;
* ``TRPO``: TensorForce's ``NaturalGradient`` inside ``OptimizedStep`` (Schulman et al. 2015,
  :mod:`.trpo`): the conjugate-gradient solve of ``F x = g`` with Fisher-vector products of
  the mean KL, the step scaled to ``max_kl``, a backtracking line search;
* ``PPO``: the clipped likelihood ratio (Schulman et al. 2017, :mod:`.ppo`), ``epochs`` passes
  of ``minibatches`` solver updates over the batch's steps;

and ``steps`` (TensorForce's ``MultiStep``): the rule repeated on the same batch.

==================  ========  =========================================================
field               default   source
==================  ========  =========================================================
``cg_iterations``   10        Schulman's modular_rl ``cg_iters``
``cg_damping``      0.1       modular_rl ``cg_damping``
``max_kl``          0.01      modular_rl ``max_kl``
``line_search_...`` 10        modular_rl ``linesearch`` ``max_backtracks``
``backtrack``       0.5       ``.5**np.arange(max_backtracks)``
``accept_ratio``    0.1       ``accept_ratio``
``kl_factor``       1.5       OpenAI baselines' trpo_mpi: reject a step past 1.5·max_kl
``clip``            0.2       PPO paper's ε
``epochs``          4         —
``minibatches``     4         —
``value_blob``      ""        — (no baseline: MyCaffe's standardised return)
``chunk_rows``      8192      — (Cart-Pole-v1: 5,000 rows, one call)
==================  ========  =========================================================

With ``value_blob`` PPO learns a value baseline (:mod:`.learners`): the advantage is
``R − V_old(s)`` standardised over the batch's real steps, the value loss
``loss_weight · mean((V(s) − R)²)`` joins the clipped objective, ``loss_weight`` the one
the net gives the value top (:meth:`.policy.PolicyNet.value_blob`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from caffe2jax.runtime.rl.policy import RLError

PG, TRPO, PPO = "PG", "TRPO", "PPO"
TYPES = (PG, TRPO, PPO)


@dataclass(frozen=True)
class UpdateSettings:
    """A resolved ``RLUpdateParameter`` (static: part of the jit configuration)."""

    type: str = PG
    steps: int = 1
    cg_iterations: int = 10
    cg_damping: float = 0.1
    max_kl: float = 0.01
    line_search_steps: int = 10
    backtrack: float = 0.5
    accept_ratio: float = 0.1
    kl_factor: float = 1.5
    clip: float = 0.2
    epochs: int = 4
    minibatches: int = 4
    value_blob: str = ""  # PPO's value baseline head (a net top); "": none
    chunk_rows: int = 8192  # rows of the batch evaluated at once; 0: all

    @property
    def is_default(self) -> bool:
        """MyCaffe's rule, one update a batch: the trainer's original program."""
        return self.type == PG and self.steps == 1


def from_proto(rl: Any) -> UpdateSettings:
    """The settings ``rl_param``'s ``update`` asks for (unset: PG, one step)."""
    if not rl.HasField("update"):
        return UpdateSettings()
    u = rl.update
    names = [f for f in UpdateSettings.__dataclass_fields__ if f != "type"]
    values = {name: _decimal(getattr(u, name)) for name in names}
    values["value_blob"] = values["value_blob"].strip()
    settings = UpdateSettings(type=u.type.strip().upper(), **values)
    check(settings)
    return settings


def _decimal(value: Any) -> Any:
    """A proto float as the decimal the prototxt wrote (0.1, not float32's 0.100000001)."""
    return float(f"{value:.7g}") if isinstance(value, float) else value


def check(s: UpdateSettings) -> None:
    """One-line RLErrors for an update the trainer cannot run."""
    if s.type not in TYPES:
        raise RLError(f"rl_param update type must be one of {', '.join(TYPES)}; got '{s.type}'")
    for name in ("steps", "cg_iterations", "line_search_steps", "epochs", "minibatches"):
        if getattr(s, name) < 1:
            raise RLError(f"rl_param update {name} must be >= 1, got {getattr(s, name)}")
    if s.max_kl <= 0 or s.cg_damping < 0 or s.kl_factor < 0:
        raise RLError(
            "rl_param update needs max_kl > 0, cg_damping >= 0 and kl_factor >= 0; got "
            f"{s.max_kl}, {s.cg_damping}, {s.kl_factor}"
        )
    if not 0 < s.backtrack < 1 or not 0 <= s.accept_ratio <= 1:
        raise RLError(
            f"rl_param update backtrack must lie in (0, 1) and accept_ratio in [0, 1]; got "
            f"{s.backtrack}, {s.accept_ratio}"
        )
    if not 0 < s.clip < 1:
        raise RLError(f"rl_param update clip must lie in (0, 1), got {s.clip}")
    if s.value_blob and s.type != PPO:
        raise RLError(
            f"rl_param update value_blob ('{s.value_blob}') is PPO's value baseline; "
            f"type is {s.type}"
        )
