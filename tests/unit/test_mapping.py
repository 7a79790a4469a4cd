"""Agent to policy mapping: resolution, validation messages, and per-policy space checks."""

from __future__ import annotations

import pytest
from gymnasium.spaces import Box, Discrete

from hpcmarl.algos.mapping import check_policy_spaces, policies_of, resolve_mapping
from hpcmarl.errors import ConfigError, EnvError

AGENTS = ["adversary_0", "agent_0", "agent_1"]


def test_shared_maps_every_agent_to_one_policy() -> None:
    mapping = resolve_mapping("shared", AGENTS)
    assert mapping == {a: "shared" for a in AGENTS}
    assert policies_of(mapping) == ["shared"]


def test_independent_names_policies_after_agents() -> None:
    mapping = resolve_mapping("independent", AGENTS)
    assert mapping == {a: a for a in AGENTS}
    assert policies_of(mapping) == AGENTS


def test_explicit_dict_maps_teams_and_lists_policies_sorted() -> None:
    given = {"agent_1": "good", "adversary_0": "bad", "agent_0": "good"}
    mapping = resolve_mapping(given, AGENTS)
    assert mapping == given
    assert list(mapping) == AGENTS  # environment order, whatever the YAML order
    assert policies_of(mapping) == ["bad", "good"]


def test_unknown_agent_is_named_with_the_valid_ids() -> None:
    given = {"agent_0": "p", "agent_1": "p", "adversary_0": "p", "agent_9": "p"}
    with pytest.raises(ConfigError) as info:
        resolve_mapping(given, AGENTS)
    assert "agent_9" in info.value.cause
    assert all(a in info.value.fix for a in AGENTS)


def test_missing_agent_is_named() -> None:
    with pytest.raises(ConfigError, match="adversary_0"):
        resolve_mapping({"agent_0": "p", "agent_1": "p"}, AGENTS)


@pytest.mark.parametrize("bad", ["sharde", 3, None])
def test_unknown_mapping_kind_says_what_is_allowed(bad: object) -> None:
    with pytest.raises(ConfigError, match="independent"):
        resolve_mapping(bad, AGENTS)


@pytest.mark.parametrize("policy", ["", "a/b", 7])
def test_unusable_policy_ids_are_refused(policy: object) -> None:
    with pytest.raises(ConfigError, match="policy id"):
        resolve_mapping({a: policy for a in AGENTS}, AGENTS)


def test_agents_of_one_policy_must_share_spaces() -> None:
    obs = {
        "adversary_0": Box(-1, 1, (8,)),
        "agent_0": Box(-1, 1, (10,)),
        "agent_1": Box(-1, 1, (10,)),
    }
    actions = {a: Discrete(5) for a in AGENTS}
    check_policy_spaces(resolve_mapping("independent", AGENTS), obs, actions)
    check_policy_spaces({"adversary_0": "bad", "agent_0": "good", "agent_1": "good"}, obs, actions)
    with pytest.raises(EnvError) as info:
        check_policy_spaces(resolve_mapping("shared", AGENTS), obs, actions)
    assert "adversary_0" in info.value.cause and "independent" in info.value.fix
    actions["agent_1"] = Discrete(4)
    with pytest.raises(EnvError, match="agent_1"):
        check_policy_spaces({a: "good" for a in ["agent_0", "agent_1"]}, obs, actions)
