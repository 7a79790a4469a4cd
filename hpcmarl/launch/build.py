"""Building the roles a rank hosts, from the job, the env description and the topology.

Rank 0 probes the environment once (so that an unknown id or an algorithm that does not fit
fails before any work starts) and broadcasts what it learned as an `EnvSpec`; every rank then
builds its own roles from the same inputs. The algorithm is a registry entry (`algos.registry`):
its item spec shapes the collectors' writers and the shards' tables, its policy specs fill the
commander's population, and its class is what learners train.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np

from ..algos import registry
from ..algos.catalog import on_policy_window
from ..algos.contract import GroupSpec
from ..algos.mapping import check_policy_spaces, resolve_groups, resolve_mapping
from ..algos.torsos import check_torso, space_json
from ..comm.allreduce import make_averager
from ..comm.placement import device_line, learner_device, make_cuda_deterministic
from ..comm.transport import LocalTransport
from ..config.loader import job_to_dict
from ..config.schema import JobConfig
from ..core import Role, policy_key
from ..envs import make_vector_env
from ..envs.adapters import box_bounds
from ..errors import ConfigError, EnvError, TopologyError
from ..items.spec import ItemSpec
from ..items.writers import ItemWriter, make_writer
from ..metrics import MetricsSink
from ..population import Population, server_for
from ..psro.checks import check_psro_job
from ..replay.compact_items import COMPACT_KINDS
from ..replay.offline import load_share
from ..roles.collector import Collector
from ..roles.commander import Commander
from ..roles.learner import GroupTrainer, Learner, Target
from ..roles.param_server import ParameterServer
from ..roles.replay_shard import ReplayShard
from .plan import Routes, Wiring, compact_runs, group_members, resolve_wiring, storage_form
from .topology import Topology


@dataclass
class EnvSpec:
    """What the roles need to know of the environment: agents, sizes, mapping and groups."""

    agents: list[str]
    obs_dims: dict[str, int]
    n_actions: dict[str, int]
    policy_of: dict[str, str]
    state_dim: int = 0
    groups: dict[str, list[str]] | None = None
    """Training group -> its policies (None: one group per policy)."""
    action_masks: bool = False
    """The env supplies legal-action masks (they become item columns and actor inputs)."""
    turn_based: bool = False
    """One agent acts per step: transitions span from an agent's turn to its next one."""
    time_limit: int | None = None
    """The env's own episode limit (a gymnasium TimeLimit), if it has one we know of."""
    unlimited: bool = False
    """The env is known to have no time limit: its episodes may never end."""
    obs_spaces: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """agent -> its observation space as JSON (`algos.torsos.space_json`), for torsos."""
    action_boxes: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = dataclasses.field(
        default_factory=dict
    )
    """agent -> the flat (low, high) of its `Box` action space (`n_actions` is its width);
    empty for discrete actions."""

    @property
    def policies(self) -> list[str]:
        return sorted(set(self.policy_of.values()))

    def training_groups(self) -> dict[str, list[str]]:
        return self.groups or {p: [p] for p in self.policies}

    def policy_dims(self, policy: str) -> tuple[int, int]:
        agent = next(a for a in self.agents if self.policy_of[a] == policy)
        return self.obs_dims[agent], self.n_actions[agent]

    def group_spec(self, group: str, strategy_spec_id: str) -> GroupSpec:
        policies = self.training_groups()[group]
        agents = tuple(a for a in self.agents if self.policy_of[a] in policies)
        return GroupSpec(
            name=group,
            agents=agents,
            policy_of={a: self.policy_of[a] for a in agents},
            keys={p: policy_key(strategy_spec_id, p) for p in policies},
            obs_dims={a: self.obs_dims[a] for a in agents},
            n_actions={a: self.n_actions[a] for a in agents},
            state_dim=self.state_dim,
            agent_ids={a: self.agents.index(a) for a in agents},
            action_masks=self.action_masks,
            obs_spaces={a: self.obs_spaces[a] for a in agents if a in self.obs_spaces},
            action_boxes={a: self.action_boxes[a] for a in agents if a in self.action_boxes},
        )

    def bindings(self, strategy_spec_id: str) -> dict[str, str]:
        """agent -> the key of the policy it acts with."""
        return {a: policy_key(strategy_spec_id, p) for a, p in self.policy_of.items()}


def probe_env(cfg: JobConfig) -> EnvSpec:
    """Create the environment once to learn its agents, spaces and masks (a gymnasium env
    shows its masks only at reset, hence the reset); refuse misfits early."""
    env = make_vector_env(cfg.env, 1, cfg.seed, frame_stack=frame_stack_of(cfg))
    env.reset()
    policy_of = resolve_mapping(cfg.agents.mapping, env.agents)
    for agent in env.agents:
        space = env.action_space(agent)
        registry.check_fits(cfg.learner.algo, space, cfg.psro.enabled, bool(cfg.offline.dataset))
    env.check_api()
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
        env.state_dim,
        action_masks=env.has_masks,
        turn_based=env.turn_based,
        time_limit=env.time_limit,
        unlimited=env.unlimited,
    )
    spec.groups = resolve_groups(cfg.agents.groups, spec.policies) if cfg.agents.groups else None
    spaces = {a: env.observation_space(a) for a in env.agents}
    spec.obs_spaces = {a: space_json(s, spec.obs_dims[a]) for a, s in spaces.items()}
    boxes = {a: box_bounds(env.action_space(a)) for a in env.agents}
    spec.action_boxes = {a: box for a, box in boxes.items() if box is not None}
    env.close()
    check_torso(cfg.learner.model, spaces, spec.obs_dims)
    registry.check_job(cfg, spec.training_groups())
    check_psro_job(cfg, spec.training_groups(), len(spec.agents))
    check_items(cfg, spec)
    check_storage(cfg, spec, spaces)
    return spec


DEFAULT_EVAL_MAX_STEPS = 10_000
"""Where an env has no time limit of its own, evaluation episodes end after this many steps."""


def eval_episode_cap(cfg: JobConfig, spec: EnvSpec) -> int:
    """Steps after which an evaluation episode is cut: the job's, the env's, or the default."""
    if cfg.commander.eval_max_episode_steps is not None:
        return cfg.commander.eval_max_episode_steps
    return spec.time_limit or DEFAULT_EVAL_MAX_STEPS


def time_limit_line(cfg: JobConfig, spec: EnvSpec) -> str:
    """A start-up warning for an env whose episodes may never end, else nothing."""
    if not spec.unlimited:
        return ""
    return (
        f"hpcmarl: warning: {cfg.env.id} has no time limit, so its episodes may never end; "
        f"evaluation episodes are cut at {eval_episode_cap(cfg, spec):,} steps "
        "(commander.eval_max_episode_steps) and counted as truncated; give the env a limit "
        "(env.kwargs.max_episode_steps=N, or a gymnasium TimeLimit) if it should have one"
    )


def frame_stack_of(cfg: JobConfig) -> int:
    """Frames the env copies stack for acting: `replay.stack_num`, unless the env stacks its
    own (`replay.save_only_last_obs`)."""
    return 1 if cfg.replay.save_only_last_obs else cfg.replay.stack_num


def check_storage(cfg: JobConfig, spec: EnvSpec, spaces: dict[str, gymnasium.Space]) -> None:
    """The producer options store what collectors send to replay tables: transition rows,
    episodes or sequences (on-policy fragments are trained on once and dropped); an env said
    to stack its own frames must do so on its first axis."""
    r, form = cfg.replay, storage_form(cfg)
    if not (form.compact or r.save_only_last_obs):
        return
    options = "replay.stack_num, replay.ignore_obs_next and replay.save_only_last_obs"
    decl = registry.decl_of(cfg.learner.algo)
    if decl.items not in ("transition", *COMPACT_KINDS):
        raise ConfigError(
            f"{options} store replayed items (transitions, episodes, sequences); "
            f"learner.algo = {decl.name} trains on {decl.items}s, once each, from a queue",
            "remove those keys, or use an off-policy algorithm (dqn, qmix, vdn, r2d2)",
        )
    if cfg.offline.dataset:
        raise ConfigError(
            f"{options} store what collectors send; an offline job reads replay files instead",
            "remove those keys from the offline job",
        )
    if r.ignore_obs_next and any(i.n_step > 1 for i in item_specs(cfg, spec).values()):
        raise ConfigError(
            "replay.ignore_obs_next rebuilds s' from the next step, and "
            f"learner.{decl.section}.n_step > 1 makes s' the step n ahead",
            f"set learner.{decl.section}.n_step=1 or replay.ignore_obs_next=false",
        )
    if not r.save_only_last_obs:
        return
    if r.stack_num == 1:
        raise ConfigError(
            "replay.save_only_last_obs keeps the newest of replay.stack_num frames, and "
            "replay.stack_num is 1",
            "set replay.stack_num to the number of frames the env stacks",
        )
    for agent, space in spaces.items():
        shape = getattr(space, "shape", None) or ()
        if not shape or shape[0] != r.stack_num:
            raise EnvError(
                f"replay.save_only_last_obs: {agent} observes shape {list(shape)}, not "
                f"{r.stack_num} stacked frames on the first axis (replay.stack_num)",
                "set replay.stack_num to the env's stack size, or replay.save_only_last_obs="
                "false to let hpcmarl stack the frames",
            )


def check_storage_topology(cfg: JobConfig, topology: Topology) -> None:
    """Compact tables need each run on one shard, so each collector feeds one home shard:
    every shard needs a collector."""
    collectors, shards = topology.names("collector"), topology.names("replay_shard")
    if compact_runs(cfg) and len(collectors) < len(shards):
        raise TopologyError(
            f"replay.stack_num / replay.ignore_obs_next keep each collector's runs on one "
            f"replay shard, and {len(shards)} shards outnumber {len(collectors)} collectors",
            f"set topology.replay_shards to at most {len(collectors)}, or add collectors",
        )


def check_items(cfg: JobConfig, spec: EnvSpec) -> None:
    """A joint item needs one observation width per group and, for a team's episodes, agents
    that act together; an on-policy window must hold at least one collect task, or
    collection could never start."""
    decl = registry.decl_of(cfg.learner.algo)
    if spec.turn_based and decl.items == "episode":
        raise EnvError(
            f"learner.algo = {decl.name} mixes the Q-values of agents that act together, and "
            f"{cfg.env.id} is turn-based (one player acts per step)",
            "use learner.algo=dqn or ppo on turn-based games, or a simultaneous-move env",
        )
    if decl.items == "sequence":
        check_sequences(cfg)
    for group in spec.training_groups():
        group_spec = spec.group_spec(group, "s")
        if len(group_spec.agents) == 1 or decl.items == "transition":
            continue  # one agent, or transition items: any widths fit
        widths = {spec.obs_dims[a] for a in group_spec.agents}
        if len(widths) > 1:
            raise EnvError(
                f"group {group!r} holds agents observing {sorted(widths)} values: its joint "
                "items need one observation width",
                "put agents with different observation spaces in different agents.groups",
            )
    if not decl.on_policy:
        return
    batch, lag = on_policy_window(cfg.learner)
    per_task = cfg.collector.fragments_per_task * cfg.env.num_envs
    window = (lag + 1) * batch
    if per_task > window:
        keys = f"learner.{decl.section}"
        raise ConfigError(
            f"a collect task yields {per_task} fragments (collector.fragments_per_task x "
            f"env.num_envs), more than the {window} the lag window holds "
            f"(({keys}.max_policy_lag + 1) x {keys}.batch_fragments)",
            f"raise {keys}.batch_fragments to at least {per_task}, or lower "
            "collector.fragments_per_task",
        )


def check_sequences(cfg: JobConfig) -> None:
    """A sequence must train at least one step past its burn-in, and consecutive sequences
    must overlap by at least the burn-in, or the steps between would never carry loss."""
    r = cfg.replay
    if r.burn_in >= r.sequence_length:
        raise ConfigError(
            f"replay.burn_in ({r.burn_in}) leaves nothing to train in sequences of "
            f"replay.sequence_length {r.sequence_length}",
            "lower replay.burn_in below replay.sequence_length",
        )
    if r.sequence_overlap >= r.sequence_length:
        raise ConfigError(
            f"replay.sequence_overlap ({r.sequence_overlap}) must be shorter than "
            f"replay.sequence_length ({r.sequence_length}): each sequence must move on",
            "lower replay.sequence_overlap (R2D2 uses half the sequence)",
        )
    if r.burn_in > r.sequence_overlap:
        raise ConfigError(
            f"replay.burn_in ({r.burn_in}) exceeds replay.sequence_overlap "
            f"({r.sequence_overlap}): the steps between two sequences would never be trained",
            f"set replay.sequence_overlap to at least {r.burn_in}",
        )


def role_seed(cfg: JobConfig, topology: Topology, name: str) -> int:
    return cfg.seed * 100_003 + list(topology.rank_of).index(name) * 1_009


def item_specs(cfg: JobConfig, spec: EnvSpec) -> dict[str, ItemSpec]:
    """Training group -> the items its algorithm trains on."""
    sid = cfg.agents.strategy_spec_id
    return {g: registry.item_spec(cfg, spec.group_spec(g, sid)) for g in spec.training_groups()}


def build_population(cfg: JobConfig, spec: EnvSpec) -> Population:
    """Every policy the job trains, with the PolicySpec its group's algorithm publishes."""
    population = Population()
    sid = cfg.agents.strategy_spec_id
    for group in spec.training_groups():
        for policy_spec in registry.policy_specs(cfg, spec.group_spec(group, sid)).values():
            population.add(policy_spec, trainable=True, group=group)
    return population


def build_roles(
    cfg: JobConfig,
    spec: EnvSpec,
    topology: Topology,
    transport: LocalTransport,
    group_comm: Any,
    run_dir: str,
    wiring: Wiring | None = None,
) -> list[Role]:
    """Every role hosted on this transport's rank, constructed in the topology's order, each
    with its routes from the job's one wiring (resolved here when not given)."""
    wiring = wiring or resolve_wiring(cfg, topology)
    roles: list[Role] = []
    for name in topology.roles_on(transport.rank):
        kind, routes = topology.kind_of[name], wiring[name]
        if kind == "commander":
            x_axis = "updates" if cfg.offline.dataset else "env_steps"
            loggers, job = cfg.runtime.loggers, job_to_dict(cfg)
            sink = MetricsSink(run_dir, agents=spec.agents, x_axis=x_axis, loggers=loggers, job=job)
            population = build_population(cfg, spec)
            bindings = spec.bindings(cfg.agents.strategy_spec_id)
            roles.append(Commander(transport, cfg, topology, sink, population, bindings))
        elif kind == "param_server":
            roles.append(ParameterServer(name, transport))
        elif kind == "replay_shard":
            roles.append(build_replay_shard(cfg, spec, topology, transport, name, routes=routes))
        elif kind == "learner":
            roles.append(
                build_learner(
                    cfg, spec, topology, transport, group_comm, name, run_dir, routes=routes
                )
            )
        else:
            roles.append(build_collector(cfg, spec, topology, transport, name, routes=routes))
    return roles


def build_replay_shard(
    cfg: JobConfig,
    spec: EnvSpec,
    topology: Topology,
    transport: LocalTransport,
    name: str,
    routes: Routes | None = None,
) -> ReplayShard:
    """A shard fed by the collectors its routes name, or offline by its share of the dataset.
    (`routes` None: resolved for this shard alone, as tests and tools build one role.)"""
    routes = routes or resolve_wiring(cfg, topology)[name]
    shards = topology.names("replay_shard")
    dataset = None
    if cfg.offline.dataset:
        index = shards.index(name)
        group_of = {p: g for g, policies in spec.training_groups().items() for p in policies}

        def dataset() -> Iterator[tuple[str, dict[str, np.ndarray]]]:
            for policy, batch in load_share(cfg.offline.dataset, spec, index, len(shards)):
                yield group_of[policy], batch

    items = item_specs(cfg, spec)
    form = storage_form(cfg)
    return ReplayShard(
        name,
        transport,
        cfg.replay,
        {g: item.replay for g, item in items.items()},
        list(routes.collectors),
        role_seed(cfg, topology, name),
        deterministic=cfg.commander.deterministic,
        dataset=dataset,
        items={g: item.to_json() for g, item in items.items()},
        forms=dict.fromkeys(items, form),
    )


def build_learner(
    cfg: JobConfig,
    spec: EnvSpec,
    topology: Topology,
    transport: LocalTransport,
    group_comm: Any,
    name: str,
    run_dir: str,
    routes: Routes | None = None,
) -> Learner:
    """A learner on its host's GPU (round robin over the host's learners) or the CPU, with one
    averager per group.

    The group root announces the averaging backend in one line; choosing it is collective over
    the group, which every member reaches here, at start-up. torch.distributed meets in a file
    of the run directory named after the first group on the communicator. (`routes` None:
    resolved for this learner alone, as tests and tools build one role.)
    """
    routes = routes or resolve_wiring(cfg, topology)[name]
    device = learner_device(cfg.learner.device, topology.learner_slot(name))
    if cfg.commander.deterministic and device.startswith("cuda"):
        make_cuda_deterministic()
    if line := device_line(name, device):
        print(line, flush=True)
    servers = topology.names("param_server")
    groups = list(spec.training_groups())
    items = item_specs(cfg, spec)
    trainers = []
    for group in topology.groups_of_learner[name]:
        group_spec = spec.group_spec(group, cfg.agents.strategy_spec_id)
        # Same seed on every learner of the group: the group starts from identical weights.
        seed = cfg.seed * 7_919 + groups.index(group)
        members = group_members(topology, group)
        comm = group_comm if len(members) > 1 else None
        store = os.path.join(run_dir, f"allreduce-{group}.store")
        averager, line = make_averager(cfg.learner.allreduce, comm, f"group {group}", device, store)
        if line and group in routes.leads:
            print(line, flush=True)
        target = group_target(cfg, group_spec, seed, device, servers)
        trainers.append(
            GroupTrainer(
                group,
                target.algo,
                items[group],
                target.specs,
                averager,
                pushes_weights=group in routes.leads,
                servers=target.servers,
                members=members,
                retarget=retarget_for(cfg, group_spec, seed, device, servers),
                keys=dict(group_spec.keys),
            )
        )
    return Learner(
        name,
        transport,
        cfg.learner,
        trainers,
        list(routes.shards),
        sequential=cfg.commander.deterministic,
    )


def group_target(
    cfg: JobConfig, group_spec: GroupSpec, seed: int, device: str, servers: list[str]
) -> Target:
    """A group's algorithm, the policies it publishes and the servers that hold them."""
    algo = registry.algorithm_class(cfg.learner.algo)(group_spec, cfg, seed, device)
    specs = registry.policy_specs(cfg, group_spec)
    return Target(algo, specs, {key: server_for(key, servers) for key in specs})


def retarget_for(
    cfg: JobConfig, group_spec: GroupSpec, seed: int, device: str, servers: list[str]
) -> Callable[[dict[str, str], int], Target]:
    """How the group switches to new keys (PSRO): fresh networks, seeded by the generation so
    that every learner of the group builds the same ones."""

    def retarget(keys: dict[str, str], generation: int) -> Target:
        switched = dataclasses.replace(group_spec, keys=keys)
        return group_target(cfg, switched, seed + 104_729 * generation, device, servers)

    return retarget


def build_collector(
    cfg: JobConfig,
    spec: EnvSpec,
    topology: Topology,
    transport: LocalTransport,
    name: str,
    routes: Routes | None = None,
) -> Collector:
    """A collector feeding the shards its routes name and pulling from their servers.
    (`routes` None: resolved for this collector alone, as tests and tools build one role.)"""
    routes = routes or resolve_wiring(cfg, topology)[name]
    seed = role_seed(cfg, topology, name)
    items = item_specs(cfg, spec)
    with_state = any("state" in i.names for i in items.values())
    frame_stack = frame_stack_of(cfg)
    env = make_vector_env(cfg.env, cfg.env.num_envs, seed, with_state, frame_stack)
    length, agent_ids = cfg.collector.fragment_length, {a: i for i, a in enumerate(spec.agents)}
    writers = {}
    for group, item in items.items():
        agents = list(spec.group_spec(group, cfg.agents.strategy_spec_id).agents)
        writers[group] = make_writer(
            item, agents, agent_ids, env.num_envs, length, turn_based=spec.turn_based
        )

    evaluations = itertools.count()
    restarts = itertools.count(7_919, 7_919)

    def make_eval_env(episodes: int, eval_seed: int | None = None) -> Any:
        # New start states each evaluation, reproducible from the job seed (or the schedule's).
        if eval_seed is None:
            eval_seed = seed + 500_009 + 1_000 * next(evaluations)
        return make_vector_env(cfg.env, episodes, eval_seed, frame_stack=frame_stack)

    score = None
    if cfg.psro.enabled and cfg.psro.exploitability:
        from ..envs.openspiel import load_game
        from ..psro.exploitability import score_actors

        score = functools.partial(score_actors, load_game(cfg.env.id, dict(cfg.env.kwargs)))
    replay_log = replay_log_for(cfg, spec, name)
    log_writers = None
    one_step = all(w.spec.kind == "transition" and w.spec.n_step == 1 for w in writers.values())
    if replay_log is not None and not one_step:
        log_writers = transition_log_writers(cfg, spec, env.num_envs)
    return Collector(
        name,
        transport,
        env,
        writers,
        list(routes.shards),
        list(routes.servers),
        cfg.collector.weight_sync_fragments,
        seed,
        make_eval_env,
        remake_env=lambda: make_vector_env(
            cfg.env, cfg.env.num_envs, seed + next(restarts), with_state, frame_stack
        ),
        deterministic=cfg.commander.deterministic,
        replay_log=replay_log,
        log_writers=log_writers,
        score=score,
        eval_max_steps=eval_episode_cap(cfg, spec),
        stop_grace_s=cfg.runtime.shutdown_timeout_s / 2,
    )


def transition_log_writers(cfg: JobConfig, spec: EnvSpec, num_envs: int) -> dict[str, ItemWriter]:
    """One transition writer per agent, for the replay log of a job whose items are not
    one-step transitions: logs always hold per-agent one-step rows (docs/replay-format.md)."""
    from ..algos.dqn import transition_item

    writers = {}
    agent_ids = {a: i for i, a in enumerate(spec.agents)}
    for agent in spec.agents:
        solo = EnvSpec(
            [agent],
            spec.obs_dims,
            spec.n_actions,
            {agent: agent},
            spec.state_dim,
            action_masks=spec.action_masks,
            action_boxes=spec.action_boxes,
        )
        item = transition_item(solo.group_spec(agent, "log"), cfg)
        length = cfg.collector.fragment_length
        writers[agent] = make_writer(item, [agent], agent_ids, num_envs, length, spec.turn_based)
    return writers


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
        obs_dtypes=obs_dtypes(spec),
        action_boxes=spec.action_boxes,
    )


def obs_dtypes(spec: EnvSpec) -> dict[str, str]:
    """agent -> the dtype its training group's items keep observations in (`|u1` for image
    spaces), which is what its rows in replay files hold."""
    groups = (spec.group_spec(g, "") for g in spec.training_groups())
    return {a: group.obs_dtype for group in groups for a in group.agents}
