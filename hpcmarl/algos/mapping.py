"""Which trained policy each environment agent acts with, and which policies train together.

A job names the mapping as `shared` (one policy for every agent), `independent` (one policy per
agent, named after it) or an explicit dict {agent_id: policy_id} for teams. Training groups
(`agents.groups`) gather policies that one algorithm instance trains jointly; by default every
policy is its own group (MALib's IndependentAgent), a team is one group (its TeamAgent).
Resolving both against the environment's real agent ids happens once at start-up, so a typo
fails there with the valid ids in the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium

from hpcmarl.errors import ConfigError, EnvError

SHARED_POLICY = "shared"
"""Policy id used by the `shared` mapping."""


def resolve_mapping(mapping: Any, agent_ids: list[str]) -> dict[str, str]:
    """Turn the job's `agents.mapping` into {agent_id: policy_id} covering every agent."""
    if mapping == "shared":
        resolved = {agent: SHARED_POLICY for agent in agent_ids}
    elif mapping == "independent":
        resolved = {agent: agent for agent in agent_ids}
    elif isinstance(mapping, Mapping):
        resolved = _explicit(mapping, agent_ids)
    else:
        raise ConfigError(
            f"agents.mapping is {mapping!r}",
            "use 'shared', 'independent' or a dict {agent_id: policy_id}",
        )
    _check_policy_ids(resolved)
    return resolved


def policies_of(mapping: Mapping[str, str]) -> list[str]:
    """The distinct policy ids of a resolved mapping, sorted (the order roles iterate them)."""
    return sorted(set(mapping.values()))


def resolve_groups(groups: Mapping[str, list[str]], policies: list[str]) -> dict[str, list[str]]:
    """{group: [policy ids]} covering every policy exactly once; empty means one group per
    policy, named after it."""
    if not groups:
        return {policy: [policy] for policy in policies}
    listed = [p for members in groups.values() for p in members]
    unknown = sorted(set(listed) - set(policies))
    if unknown:
        raise ConfigError(
            f"agents.groups names unknown policy id(s) {unknown}",
            f"use the policy ids of agents.mapping: {policies}",
        )
    twice = sorted({p for p in listed if listed.count(p) > 1})
    if twice:
        raise ConfigError(
            f"agents.groups puts policy id(s) {twice} in more than one group",
            "list every policy in exactly one group",
        )
    missing = [p for p in policies if p not in listed]
    if missing:
        raise ConfigError(
            f"agents.groups leaves policy id(s) {missing} out",
            f"list every policy of agents.mapping in one group: {policies}",
        )
    return {group: sorted(members) for group, members in groups.items()}


def check_policy_spaces(
    mapping: Mapping[str, str],
    observation_spaces: Mapping[str, gymnasium.Space],
    action_spaces: Mapping[str, gymnasium.Space],
) -> None:
    """Raise `EnvError` unless all agents of one policy share the flat observation size and the
    action space: one network cannot serve inputs or outputs of different sizes."""
    first: dict[str, str] = {}
    for agent in sorted(mapping):
        policy = mapping[agent]
        ref = first.setdefault(policy, agent)
        ref_dims = _dims(observation_spaces[ref], action_spaces[ref])
        dims = _dims(observation_spaces[agent], action_spaces[agent])
        if dims != ref_dims:
            raise EnvError(
                f"policy {policy!r} serves agents {ref!r} (obs dim, actions {ref_dims}) and "
                f"{agent!r} ({dims}), which differ",
                "map agents with different spaces to different policies in agents.mapping "
                "(e.g. 'independent')",
            )


def _explicit(mapping: Mapping[Any, Any], agent_ids: list[str]) -> dict[str, str]:
    unknown = sorted(str(a) for a in mapping if a not in agent_ids)
    if unknown:
        raise ConfigError(
            f"agents.mapping names unknown agent(s) {unknown}",
            f"use the environment's agent ids: {agent_ids}",
        )
    missing = [a for a in agent_ids if a not in mapping]
    if missing:
        raise ConfigError(
            f"agents.mapping does not map agent(s) {missing}",
            f"give a policy id for every agent: {agent_ids}",
        )
    return {agent: mapping[agent] for agent in agent_ids}


def _check_policy_ids(resolved: dict[str, Any]) -> None:
    """Policy ids become weight keys `{spec}/{policy}` and HDF5 group names: plain strings."""
    for agent, policy in resolved.items():
        if not isinstance(policy, str) or not policy or "/" in policy:
            raise ConfigError(
                f"agents.mapping maps {agent!r} to {policy!r}, not a usable policy id",
                "use a non-empty string without '/' as policy id",
            )


def _dims(obs_space: gymnasium.Space, action_space: gymnasium.Space) -> tuple[int, Any]:
    actions = (
        int(action_space.n) if isinstance(action_space, gymnasium.spaces.Discrete) else action_space
    )
    return gymnasium.spaces.flatdim(obs_space), actions
