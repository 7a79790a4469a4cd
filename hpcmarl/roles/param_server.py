"""The parameter server: versioned weight tables keyed `{strategy_spec_id}/{policy_id}`.

A table is created when its key is first announced (MALib's `create_table(strategy_spec)`):
by the commander's `create_table`, or by the first push of the learner that trains it, which
carries the key's PolicySpec; whichever comes first. Learners push a whole flat weight vector;
every push bumps the table's version. Collectors pull with the version they hold and get weights
only when the table is newer, so an idle policy costs one small reply, not a weight transfer;
a first pull (version 0) also gets the PolicySpec, from which the collector builds its actor.
A pull for a key not announced yet, or for a version not pushed yet, waits here.
"""

from __future__ import annotations

import numpy as np

from ..comm.protocol import Message
from ..comm.transport import LocalTransport
from ..core import Role


class WeightTable:
    """One policy's latest weights, their version (0: nothing pushed yet) and its spec."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        """The PolicySpec as JSON."""
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
    """Holds the weight tables of the keys that hash to it."""

    kind = "param_server"

    def __init__(self, name: str, transport: LocalTransport) -> None:
        super().__init__(name, transport)
        self.tables: dict[str, WeightTable] = {}
        self.pushes = 0
        self.pending_pulls: list[Message] = []
        self.pulls = 0

    def handle_create_table(self, msg: Message) -> None:
        self.create_table(msg.meta["key"], msg.meta["spec"])

    def create_table(self, key: str, spec: str) -> WeightTable:
        table = self.tables.get(key)
        if table is None:
            table = self.tables[key] = WeightTable(spec)
        elif table.spec != spec:
            raise RuntimeError(f"policy {key} was announced with two different PolicySpecs")
        return table

    def handle_weights_push(self, msg: Message) -> None:
        assert msg.arrays is not None
        key = msg.meta["key"]
        if key not in self.tables:
            if "spec" not in msg.meta:
                raise RuntimeError(f"weights pushed for {key}, which was never announced")
            self.create_table(key, msg.meta["spec"])
        self.tables[key].set_weights(msg.arrays["weights"])
        self.pushes += 1

    def handle_weights_pull(self, msg: Message) -> None:
        self.pending_pulls.append(msg)

    def work(self) -> bool:
        return self.answer_pulls() or self.report_stats()

    def answer_pulls(self) -> bool:
        """Answer pulls, except those for a key or a version not here yet: they wait.

        A schedule may name the version a collector must act with; its pull may overtake the
        learner's push on the way, so it waits for that push instead of taking what is here."""
        waiting, answered = [], 0
        for msg in self.pending_pulls:
            key = msg.meta["key"]
            table = self.tables.get(key)
            if table is None or table.version < max(1, msg.meta.get("min_version", 0)):
                waiting.append(msg)
                continue
            weights, version = table.get_weights(msg.meta["have_version"])
            meta = {"key": key, "version": version}
            if weights is None:
                self.send("not_newer", msg.src, meta)
            else:
                if msg.meta["have_version"] == 0:
                    meta["spec"] = table.spec
                self.send("weights", msg.src, meta, {"weights": weights})
            answered += 1
        self.pending_pulls, self.pulls = waiting, self.pulls + answered
        return answered > 0

    def state(self) -> dict:
        tables: dict[str, dict] = {}
        for key, table in self.tables.items():
            spec, policy = key.split("/", 1)
            entry: dict = {"version": table.version, "spec": table.spec}
            if table.weights is not None:
                entry["weights"] = table.weights
            tables.setdefault(spec, {})[policy] = entry
        return {**super().state(), "tables": tables}

    def load_state(self, tree: dict) -> None:
        for spec, policies in tree["tables"].items():
            for policy, entry in policies.items():
                table = self.create_table(f"{spec}/{policy}", entry["spec"])
                table.weights, table.version = entry.get("weights"), int(entry["version"])

    def counters(self) -> dict:
        versions = {key: table.version for key, table in self.tables.items()}
        return {"role": self.name, "versions": versions, "pushes": self.pushes, "pulls": self.pulls}
