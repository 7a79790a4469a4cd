"""The commander's schedules: which tasks to grant, what a finished task means, when the run is
at a boundary where it may stop or checkpoint. Each is a strategy behind `base.Schedule`.

- `FreeRunning`: off-policy; every collector and learner group as fast as it can, the replay
  shards' rate limiter keeping the two in proportion.
- `OnPolicy`: fragments collected with recent weights, trained once; collectors run ahead of the
  learners by at most `max_policy_lag` versions (`ledger.FragmentLedger` keeps the books).
- `Lockstep`: deterministic mode, for either kind: fixed rounds in a fixed order.
- `PSRO`: populations that grow by one best response per player each iteration.
"""

from hpcmarl.schedules.base import Context, Grant, Schedule, Situation
from hpcmarl.schedules.free_running import FreeRunning
from hpcmarl.schedules.lockstep import Lockstep
from hpcmarl.schedules.on_policy import OnPolicy
from hpcmarl.schedules.psro import PSRO

__all__ = [
    "PSRO",
    "Context",
    "FreeRunning",
    "Grant",
    "Lockstep",
    "OnPolicy",
    "Schedule",
    "Situation",
]
