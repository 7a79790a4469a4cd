"""The population registry: every policy key of the job, with its PolicySpec, trainable or not.

The commander owns it (DESIGN.md §7: the policy set is data, not topology). A key is
`{strategy_spec_id}/{policy_id}`; its parameter server is a function of the key (`server_for`),
so a key added while the job runs (a PSRO iteration) needs no new wiring: the commander announces
it (`create_table`), the server makes the table, collector tasks bind agents to it, and
collectors build its actor from the PolicySpec that comes with the first weights reply.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

from hpcmarl.algos.contract import PolicySpec


def server_for(key: str, servers: list[str]) -> str:
    """The parameter server holding `key`: a stable hash of the key (no start-up table)."""
    return servers[zlib.crc32(key.encode()) % len(servers)]


@dataclass
class Member:
    """One policy of the population."""

    spec: PolicySpec
    trainable: bool
    group: str | None
    """The training group that trains it; None for a frozen policy."""


class Population:
    """Key -> Member, in the order keys were added."""

    def __init__(self) -> None:
        self.members: dict[str, Member] = {}

    def add(self, spec: PolicySpec, trainable: bool, group: str | None) -> None:
        if spec.key in self.members:
            raise ValueError(f"policy key {spec.key} is already in the population")
        self.members[spec.key] = Member(spec, trainable, group)

    def freeze_group(self, group: str) -> None:
        """The group's policies train no more (PSRO: a new best response takes their place)."""
        for member in self.members.values():
            if member.group == group:
                member.trainable, member.group = False, None

    def trainable_keys(self) -> list[str]:
        return [key for key, member in self.members.items() if member.trainable]

    def keys(self) -> list[str]:
        return list(self.members)

    def spec(self, key: str) -> PolicySpec:
        return self.members[key].spec

    def bindings(self, policy_of: dict[str, str], strategy_spec_id: str) -> dict[str, str]:
        """agent -> key of the policy each agent acts with in this strategy spec."""
        bound = {agent: f"{strategy_spec_id}/{policy}" for agent, policy in policy_of.items()}
        unknown = sorted(set(bound.values()) - set(self.members))
        if unknown:
            raise KeyError(f"policy keys {unknown} are not in the population")
        return bound

    def state(self) -> dict[str, Any]:
        """The registry as JSON text (one attribute in the commander's checkpoint)."""
        plain = [
            {"spec": json.loads(m.spec.to_json()), "trainable": m.trainable, "group": m.group}
            for m in self.members.values()
        ]
        return {"members": json.dumps(plain)}

    def load_state(self, tree: dict[str, Any]) -> None:
        self.members = {}
        for entry in json.loads(tree["members"]):
            spec = PolicySpec.from_json(json.dumps(entry["spec"]))
            self.add(spec, bool(entry["trainable"]), entry["group"])
