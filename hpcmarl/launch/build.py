"""Building the roles a rank hosts, from the job, the env description and the topology.

Rank 0 probes the environment once (so that an unknown id or an algorithm that does not fit
fails before any work starts) and broadcasts what it learned as an `EnvSpec`; every rank then
builds its own roles from the same inputs.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..algos import ACTORS, ALGORITHMS, check_fits
from ..algos.mapping import check_policy_spaces, policies_of, resolve_mapping
from ..comm.allreduce import make_averager
from ..comm.placement import learner_device
from ..comm.transport import LocalTransport
from ..config.schema import JobConfig
from ..core import Role, policy_key
from ..envs import make_vector_env
from ..metrics import MetricsSink
from ..replay.offline import load_share
from ..roles.collector import Collector
from ..roles.commander import Commander
from ..roles.learner import Learner, PolicyTrainer
from ..roles.param_server import ParameterServer
from ..roles.replay_shard import ReplayShard
from .topology import Topology


@dataclass
class EnvSpec:
    """What the roles need to know of the environment: agents, sizes, policy mapping."""

    agents: list[str]
    obs_dims: dict[str, int]
    n_actions: dict[str, int]
    policy_of: dict[str, str]

    @property
    def policies(self) -> list[str]:
        return sorted(set(self.policy_of.values()))

    def policy_dims(self, policy: str) -> tuple[int, int]:
        agent = next(a for a in self.agents if self.policy_of[a] == policy)
        return self.obs_dims[agent], self.n_actions[agent]


def probe_env(cfg: JobConfig) -> EnvSpec:
    """Create the environment once to learn its agents and spaces; refuse misfits early."""
    env = make_vector_env(cfg.env, 1, cfg.seed)
    policy_of = resolve_mapping(cfg.agents.mapping, env.agents)
    for agent in env.agents:
        check_fits(cfg.learner.algo, env.action_space(agent))
    check_policy_spaces(
        policy_of,
        {a: env.observation_space(a) for a in env.agents},
        {a: env.action_space(a) for a in env.agents},
    )
    spec = EnvSpec(
        list(env.agents),
        {a: env.obs_dim(a) for a in env.agents},
        {a: env.n_actions(a) for a in env.agents},
        policy_of,
    )
    assert policies_of(policy_of) == spec.policies
    env.close()
    return spec


def role_seed(cfg: JobConfig, topology: Topology, name: str) -> int:
    return cfg.seed * 100_003 + list(topology.rank_of).index(name) * 1_009


def build_roles(
    cfg: JobConfig,
    spec: EnvSpec,
    topology: Topology,
    transport: LocalTransport,
    group_comm: Any,
    run_dir: str,
) -> list[Role]:
    """Every role hosted on this transport's rank, constructed in the topology's order."""
    roles: list[Role] = []
    for name in topology.roles_on(transport.rank):
        kind = topology.kind_of[name]
        if kind == "commander":
            roles.append(Commander(transport, cfg, topology, MetricsSink(run_dir)))
        elif kind == "param_server":
            keys = [
                policy_key(cfg.agents.strategy_spec_id, p)
                for p, ps in topology.ps_of_policy.items()
                if ps == name
            ]
            roles.append(ParameterServer(name, transport, keys))
        elif kind == "replay_shard":
            roles.append(build_replay_shard(cfg, spec, topology, transport, name))
        elif kind == "learner":
            roles.append(build_learner(cfg, spec, topology, transport, group_comm, name))
        else:
            roles.append(build_collector(cfg, spec, topology, transport, name))
    return roles


def build_replay_shard(
    cfg: JobConfig, spec: EnvSpec, topology: Topology, transport: LocalTransport, name: str
) -> ReplayShard:
    """A shard fed by every collector, or offline by its share of the dataset."""
    shards = topology.names("replay_shard")
    dataset = None
    if cfg.offline.dataset:
        index = shards.index(name)

        def dataset() -> Iterator[tuple[str, dict[str, np.ndarray]]]:
            return load_share(cfg.offline.dataset, spec, index, len(shards))

    return ReplayShard(
        name,
        transport,
        cfg.replay,
        spec.policies,
        [] if cfg.offline.dataset else topology.names("collector"),
        role_seed(cfg, topology, name),
        deterministic=cfg.commander.deterministic,
        dataset=dataset,
    )


def build_learner(
    cfg: JobConfig,
    spec: EnvSpec,
    topology: Topology,
    transport: LocalTransport,
    group_comm: Any,
    name: str,
) -> Learner:
    """A learner on this node's GPU (round robin) or the CPU, with one averager per policy.

    The group root announces the averaging backend in one line; choosing it is collective over
    the group, which every member reaches here, at start-up.
    """
    device = learner_device()
    trainers = []
    for policy in topology.policies_of_learner[name]:
        obs_dim, n_actions = spec.policy_dims(policy)
        # Same seed on every learner of the policy: the group starts from identical weights.
        seed = cfg.seed * 7_919 + spec.policies.index(policy)
        group = sorted(topology.learners_of_policy[policy], key=topology.rank_of.__getitem__)
        comm = group_comm if len(group) > 1 else None
        averager, line = make_averager(cfg.learner.allreduce, comm, policy)
        if line and group[0] == name:
            print(line, flush=True)
        trainers.append(
            PolicyTrainer(
                policy,
                policy_key(cfg.agents.strategy_spec_id, policy),
                ALGORITHMS[cfg.learner.algo](obs_dim, n_actions, cfg.learner, seed, device),
                averager,
                pushes_weights=group[0] == name,
                members=group,
            )
        )
    return Learner(
        name,
        transport,
        cfg.learner,
        trainers,
        learner_shards(cfg, topology, name),
        topology.ps_of_policy,
        cfg.replay.prioritized,
        sequential=cfg.commander.deterministic,
    )


def learner_shards(cfg: JobConfig, topology: Topology, name: str) -> list[str]:
    """Every shard; in deterministic mode only the learner's own, so that no two learners'
    requests and priority updates interleave at one shard in an order timing decides."""
    shards = topology.names("replay_shard")
    if not cfg.commander.deterministic:
        return shards
    return [shards[topology.names("learner").index(name) % len(shards)]]


def build_collector(
    cfg: JobConfig, spec: EnvSpec, topology: Topology, transport: LocalTransport, name: str
) -> Collector:
    seed = role_seed(cfg, topology, name)
    env = make_vector_env(cfg.env, cfg.env.num_envs, seed)
    actor = ACTORS[cfg.learner.algo]
    actors = {p: actor(*spec.policy_dims(p), cfg.learner.hidden_sizes) for p in spec.policies}
    keys = {p: policy_key(cfg.agents.strategy_spec_id, p) for p in spec.policies}

    evaluations = itertools.count()
    restarts = itertools.count(7_919, 7_919)

    def make_eval_env(episodes: int, eval_seed: int | None = None) -> Any:
        # New start states each evaluation, reproducible from the job seed (or the schedule's).
        if eval_seed is None:
            eval_seed = seed + 500_009 + 1_000 * next(evaluations)
        return make_vector_env(cfg.env, episodes, eval_seed)

    return Collector(
        name,
        transport,
        env,
        actors,
        spec.policy_of,
        keys,
        topology.ps_of_policy,
        topology.names("replay_shard"),
        cfg.collector.fragment_length,
        cfg.collector.weight_sync_fragments,
        seed,
        make_eval_env,
        remake_env=lambda: make_vector_env(cfg.env, cfg.env.num_envs, seed + next(restarts)),
        deterministic=cfg.commander.deterministic,
        replay_log=replay_log_for(cfg, spec, name),
    )


def replay_log_for(cfg: JobConfig, spec: EnvSpec, name: str) -> Any:
    """The collector's replay file writer when the job asks for one (`replay_log.enabled`);
    offline, collectors only evaluate and write nothing."""
    if not cfg.replay_log.enabled or cfg.offline.dataset:
        return None
    from ..storage.replay_log import ReplayLogWriter

    path = os.path.join(cfg.runtime.run_dir, "replay", f"{name}.h5")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    meta = {"job": cfg.name, "collector": name, "seed": cfg.seed}
    return ReplayLogWriter(
        path,
        agents=spec.agents,
        policy_of=spec.policy_of,
        obs_dims=spec.obs_dims,
        n_actions=spec.n_actions,
        env_id=cfg.env.id,
        flush_every=cfg.replay_log.flush_every_fragments,
        meta=meta,
    )
