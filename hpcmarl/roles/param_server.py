"""The parameter server: versioned weight tables keyed `{strategy_spec_id}/{policy_id}`.

Learners push a whole flat weight vector; every push bumps the table's version. Collectors pull
with the version they hold and get weights only when the table is newer, so an idle policy
costs one small reply, not a weight transfer.
"""

from __future__ import annotations

import numpy as np

from ..comm.protocol import Message
from ..comm.transport import LocalTransport
from ..core import Role


class WeightTable:
    """One policy's latest weights and their version (0: nothing pushed yet)."""

    def __init__(self) -> None:
        self.weights: np.ndarray | None = None
        self.version = 0

    def set_weights(self, weights: np.ndarray) -> int:
        # The new array replaces the old one, never overwrites it: a send of the old one may
        # still be reading it.
        self.weights = weights
        self.version += 1
        return self.version

    def get_weights(self, have_version: int) -> tuple[np.ndarray | None, int]:
        """Weights newer than `have_version`, or None when the caller is up to date."""
        if self.weights is None or self.version <= have_version:
            return None, self.version
        return self.weights, self.version


class ParameterServer(Role):
    """Holds the weight tables of the policies the topology assigned to it."""

    kind = "param_server"

    def __init__(self, name: str, transport: LocalTransport, keys: list[str]) -> None:
        super().__init__(name, transport)
        self.tables = {key: WeightTable() for key in keys}
        self.pushes = 0
        self.pending_pulls: list[Message] = []
        self.pulls = 0

    def handle_weights_push(self, msg: Message) -> None:
        assert msg.arrays is not None
        self.tables[msg.meta["key"]].set_weights(msg.arrays["weights"])
        self.pushes += 1

    def handle_weights_pull(self, msg: Message) -> None:
        self.pending_pulls.append(msg)

    def work(self) -> bool:
        return self.answer_pulls() or self.report_stats()

    def answer_pulls(self) -> bool:
        """Answer pulls, except those asking for a version not pushed yet: they wait here.

        A deterministic schedule names the version a collector must act with; its pull may
        overtake the learner's push on the way, so it waits for that push instead of taking
        whatever is here."""
        waiting, answered = [], 0
        for msg in self.pending_pulls:
            key = msg.meta["key"]
            if self.tables[key].version < msg.meta.get("min_version", 0):
                waiting.append(msg)
                continue
            weights, version = self.tables[key].get_weights(msg.meta["have_version"])
            meta = {"key": key, "version": version}
            if weights is None:
                self.send("not_newer", msg.src, meta)
            else:
                self.send("weights", msg.src, meta, {"weights": weights})
            answered += 1
        self.pending_pulls, self.pulls = waiting, self.pulls + answered
        return answered > 0

    def state(self) -> dict:
        tables: dict[str, dict] = {}
        for key, table in self.tables.items():
            spec, policy = key.split("/", 1)
            entry: dict = {"version": table.version}
            if table.weights is not None:
                entry["weights"] = table.weights
            tables.setdefault(spec, {})[policy] = entry
        return {**super().state(), "tables": tables}

    def load_state(self, tree: dict) -> None:
        for spec, policies in tree["tables"].items():
            for policy, entry in policies.items():
                table = self.tables.setdefault(f"{spec}/{policy}", WeightTable())
                table.weights, table.version = entry.get("weights"), int(entry["version"])

    def counters(self) -> dict:
        versions = {key: table.version for key, table in self.tables.items()}
        return {"role": self.name, "versions": versions, "pushes": self.pushes, "pulls": self.pulls}
