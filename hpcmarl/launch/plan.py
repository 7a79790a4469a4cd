"""Who exchanges data with whom: every role instance's routes, resolved once from the job and
its placement.

Builders take each role's routes from here instead of deciding them again, and the wiring
printed at start lists these same routes, so what is printed is what runs. Control messages
(tasks, stats, heartbeats, stop, checkpoints) go between every role and the commander and are
not listed per instance. A parameter server is not chosen per route: a key's server is a hash
of the key (`population.server_for`) over the servers listed here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..algos import registry
from ..config.schema import JobConfig
from ..replay.compact import StorageForm
from .topology import Topology, name_spans


@dataclass(frozen=True)
class Routes:
    """One role instance's data peers."""

    shards: tuple[str, ...] = ()
    """A collector: the shards it feeds (its home shard when tables are compact). A learner:
    the shards it samples (its share of them in deterministic mode, off-policy)."""
    servers: tuple[str, ...] = ()
    """A collector: the servers it pulls weights from. A learner: the servers it pushes
    weights to (none unless it leads a group)."""
    collectors: tuple[str, ...] = ()
    """A replay shard: the collectors that feed it (it grants them credit)."""
    leads: tuple[str, ...] = ()
    """A learner: the groups whose weights it pushes (it is their first member by rank)."""


@dataclass(frozen=True)
class Family:
    """A kind of data route: who starts it, with whom, the messages each way, its label."""

    initiator: str
    peer: str
    arrow: str
    sends: tuple[str, ...]
    replies: tuple[str, ...]
    label: str


FAMILIES: tuple[Family, ...] = (
    Family("collector", "replay_shard", "->", ("batch",), ("credit",), "batches"),
    Family(
        "learner", "replay_shard", "<-", ("sample_request", "priorities"), ("sample",), "samples"
    ),
    Family("learner", "param_server", "->", ("weights_push",), (), "weights"),
    Family(
        "collector", "param_server", "<-", ("weights_pull",), ("weights", "not_newer"), "weights"
    ),
)


@dataclass(frozen=True)
class Wiring:
    """The resolved routes of a job on its placement: builders read each role's, the wiring
    printed at start lists them, a test holds them against the message table."""

    topology: Topology
    routes: dict[str, Routes]
    home_shards: bool
    """Each collector feeds one home shard (compact tables), not every shard."""

    def __getitem__(self, name: str) -> Routes:
        return self.routes[name]

    def peers(self, family: Family) -> dict[str, list[str]]:
        """Each initiator of the family -> the peers it exchanges the family's messages with."""
        out: dict[str, list[str]] = {}
        for name in self.topology.names(family.initiator):
            if family.initiator == "collector" and family.peer == "replay_shard":
                targets = [s for s, r in self.routes.items() if name in r.collectors]
            elif family.peer == "replay_shard":
                targets = list(self.routes[name].shards)
            else:
                targets = list(self.routes[name].servers)
            if targets:
                out[name] = targets
        return out

    def route_list(self) -> list[tuple[str, str, str]]:
        """Every data route as (sender, receiver, message), replies included."""
        out = []
        for family in FAMILIES:
            for name, targets in self.peers(family).items():
                for target in targets:
                    out += [(name, target, m) for m in family.sends]
                    out += [(target, name, m) for m in family.replies]
        return out

    def lines(self) -> list[str]:
        """The routes as printed at start, initiators with the same peers on one line:
        `collector0-8 step 2 -> replay0 (batches, home shard)`, `learner1 <- replay1`."""
        lines = []
        for family in FAMILIES:
            by_peers: dict[tuple[str, ...], list[str]] = {}
            for name, peers in self.peers(family).items():
                by_peers.setdefault(tuple(peers), []).append(name)
            label = family.label
            if family.sends == ("batch",):
                label += ", home shard" if self.home_shards else ", a round robin per group"
            for shared, names in by_peers.items():
                left, right = ", ".join(name_spans(names)), ", ".join(name_spans(list(shared)))
                lines.append(f"{left} {family.arrow} {right} ({label})")
        return lines + ["every role <-> commander (control messages)"]


def resolve_wiring(cfg: JobConfig, topology: Topology) -> Wiring:
    """Every role instance -> its routes (commander and servers: none of their own)."""
    routes = dict.fromkeys(topology.rank_of, Routes())
    servers = tuple(topology.names("param_server"))
    fed_by: dict[str, list[str]] = {s: [] for s in topology.names("replay_shard")}
    for collector in topology.names("collector"):
        shards = tuple(collector_shards(cfg, topology, collector))
        routes[collector] = Routes(shards=shards, servers=servers)
        for shard in shards if not cfg.offline.dataset else ():
            fed_by[shard].append(collector)
    for shard, collectors in fed_by.items():
        routes[shard] = Routes(collectors=tuple(collectors))
    for learner in topology.names("learner"):
        groups = topology.groups_of_learner[learner]
        leads = tuple(g for g in groups if group_members(topology, g)[0] == learner)
        shards = tuple(learner_shards(cfg, topology, learner))
        routes[learner] = Routes(shards=shards, servers=servers if leads else (), leads=leads)
    return Wiring(topology, routes, compact_runs(cfg))


def group_members(topology: Topology, group: str) -> list[str]:
    """A group's learners by rank: the first pushes the group's weights."""
    return sorted(topology.learners_of_group[group], key=topology.rank_of.__getitem__)


def storage_form(cfg: JobConfig) -> StorageForm:
    """How the job's replay tables store their items (MALib's producer options)."""
    return StorageForm(stack_num=cfg.replay.stack_num, ignore_obs_next=cfg.replay.ignore_obs_next)


def compact_runs(cfg: JobConfig) -> bool:
    """Whether tables store compact transition rows, which are rebuilt from the other rows of
    their run: then each collector feeds one home shard. Compact episodes and sequences
    rebuild themselves and go to any shard."""
    return storage_form(cfg).compact and registry.decl_of(cfg.learner.algo).items == "transition"


def home_shard(topology: Topology, collector: str) -> str:
    """The one shard a collector feeds when its tables are compact."""
    shards = topology.names("replay_shard")
    return shards[topology.names("collector").index(collector) % len(shards)]


def collector_shards(cfg: JobConfig, topology: Topology, collector: str) -> list[str]:
    """Its home shard when tables are compact, else every shard (a round robin per group)."""
    if compact_runs(cfg):
        return [home_shard(topology, collector)]
    return topology.names("replay_shard")


def learner_shards(cfg: JobConfig, topology: Topology, name: str) -> list[str]:
    """Every shard (on-policy learners take what the commander assigns them, from any shard).

    In deterministic mode, off-policy, the learner's share of them: member j of a group of n
    learners samples shards j, j + n, ... in turn (`Learner.request_samples`). So no two
    learners of a group sample one shard, where their requests and priority updates would
    interleave in an order timing decides, and together they sample every shard, as
    collectors deal each group's items over every shard. (A group of more learners than
    shards shares them out: member j samples shard j mod S.)"""
    shards = topology.names("replay_shard")
    on_policy = registry.decl_of(cfg.learner.algo).on_policy
    if not cfg.commander.deterministic or on_policy:
        return shards
    group = next(g for g, members in topology.learners_of_group.items() if name in members)
    members = group_members(topology, group)
    j, n = members.index(name), len(members)
    return shards[j::n] if n < len(shards) else [shards[j % len(shards)]]
