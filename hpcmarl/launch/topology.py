"""The wiring diagram: world size + job -> which rank hosts which roles, who talks to whom.

Rank 0 hosts the commander. A world at least as large as the role count gets one role per
rank: by host when the ranks span several (`host_placement`: learners on the GPUs, shards
beside them, the rest spread), else in naming order (commander, servers, shards, learners,
collectors on ranks 0, 1, 2, ...). A smaller world co-locates roles on the least loaded ranks
(learners first, each on its own rank, because data-parallel learners of a group must sit on
distinct ranks to allreduce), spread over the hosts where ranks load alike.
One process hosts everything; the same role classes run either way. Learners are placed per
training group; policy keys are not placed at all: a key's parameter server is a function of
the key (`population.server_for`), so keys can be added while the job runs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..comm.placement import host_slots
from ..comm.protocol import format_table
from ..config.schema import TopologyConfig
from ..errors import TopologyError
from .host_placement import place_by_host

ROLE_COST = {
    "commander": 0.2,
    "param_server": 0.2,
    "replay_shard": 0.4,
    "learner": 1.0,
    "collector": 1.0,
}
ROLE_PREFIX = {
    "commander": "commander",
    "param_server": "ps",
    "replay_shard": "replay",
    "learner": "learner",
    "collector": "collector",
}


@dataclass
class Topology:
    """Placement of every role plus the routes derived from it."""

    world_size: int
    rank_of: dict[str, int]
    kind_of: dict[str, str]
    groups: dict[str, list[str]]
    """Training group -> the policies it trains."""
    groups_of_learner: dict[str, list[str]]
    learners_of_group: dict[str, list[str]]
    notes: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    """Each rank's host name, by rank, as gathered at start; empty where unknown (one process)."""

    def names(self, kind: str) -> list[str]:
        return [name for name, k in self.kind_of.items() if k == kind]

    def roles_on(self, rank: int) -> list[str]:
        return [name for name, r in self.rank_of.items() if r == rank]

    def group_color(self, rank: int) -> int | None:
        """Index of the multi-learner group hosted on `rank`, for the learner sub-communicator."""
        groups = [tuple(v) for v in self.learners_of_group.values() if len(v) > 1]
        for color, group in enumerate(sorted(set(groups))):
            if any(self.rank_of[name] == rank for name in group):
                return color
        return None

    def learner_slot(self, name: str) -> int:
        """Learner `name`'s index among the learners on its host, by rank: its GPU, modulo the
        host's GPU count (`comm.placement`)."""
        if not self.hosts:
            return 0
        ranks = [self.rank_of[learner] for learner in self.names("learner")]
        return host_slots(self.hosts, ranks)[self.rank_of[name]]

    def summary(self) -> str:
        """The wiring printed at start by default: one line per host naming its ranks and
        roles when the ranks span several hosts, else one line per rank and the host's, then
        the notes; a
        job of many roles starts without pages of routes (`runtime.print_wiring: full`)."""
        lines = [
            f"hpcmarl: topology for {self.world_size} rank(s) (runtime.print_wiring=full "
            "adds the groups, routes and messages)"
        ]
        if len(set(self.hosts)) > 1:
            lines += self.host_lines(self.hosts)
        else:  # and the host's name, when known: which node a requeued run landed on
            lines += self.rank_lines() + (self.host_lines(self.hosts) if self.hosts else [])
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def rank_lines(self) -> list[str]:
        return [
            f"  rank {rank:>3}: {', '.join(name_spans(self.roles_on(rank))) or '(idle)'}"
            for rank in range(self.world_size)
        ]

    def format(self, routes: Sequence[str] = ()) -> str:
        """The full wiring (`runtime.print_wiring: full`): each rank's roles, one line per host
        naming its ranks and roles (when the hosts are known), then groups, the routes
        (`plan.Wiring.lines`) and messages."""
        lines = [f"hpcmarl: topology for {self.world_size} rank(s)", *self.rank_lines()]
        lines += self.host_lines(self.hosts) if self.hosts else []
        for group, policies in self.groups.items():
            learners = ", ".join(self.learners_of_group[group])
            lines.append(f"  group {group} (policies {', '.join(policies)}): trained by {learners}")
        lines += ["  routes:"] * bool(routes) + [f"    {route}" for route in routes]
        lines.append("  messages:\n" + format_table())
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def host_lines(self, hosts: list[str]) -> list[str]:
        """`host hpc1: ranks 0-3 (commander, ps0, learner0, collector0-5)`, hosts in the order
        of their first rank, roles in naming order; `hosts[r]` is rank r's host name."""
        ranks_of: dict[str, list[int]] = {}
        for rank, host in enumerate(hosts):
            ranks_of.setdefault(host, []).append(rank)
        lines = []
        for host, ranks in ranks_of.items():
            roles = [name for name, rank in self.rank_of.items() if hosts[rank] == host]
            label = "rank" if len(ranks) == 1 else "ranks"
            lines.append(
                f"  host {host}: {label} {spans(ranks)} ({', '.join(name_spans(roles)) or 'idle'})"
            )
        return lines


def spans(numbers: list[int]) -> str:
    """`0-3, 8, 10-11` from [0, 1, 2, 3, 8, 10, 11], and `0-126 step 2` for every second rank
    (a host's ranks when the launcher maps round robin)."""
    xs, i = sorted(numbers), 0
    out: list[str] = []
    while i < len(xs):
        j = i
        step = xs[i + 1] - xs[i] if i + 1 < len(xs) else 1
        while j + 1 < len(xs) and xs[j + 1] - xs[j] == step:
            j += 1
        if j == i or (step > 1 and j - i < 2):
            out.append(str(xs[i]))
            i += 1
            continue
        out.append(f"{xs[i]}-{xs[j]}" + (f" step {step}" if step > 1 else ""))
        i = j + 1
    return ", ".join(out)


def name_spans(names: list[str]) -> list[str]:
    """Role names with runs of one kind written once: `collector6-25` for twenty collectors."""
    by_prefix: dict[str, list[int]] = {}
    order: list[str] = []
    for name in names:
        prefix = name.rstrip("0123456789")
        if prefix == name:
            order.append(name)
            continue
        if prefix not in by_prefix:
            order.append(prefix)
        by_prefix.setdefault(prefix, []).append(int(name[len(prefix) :]))
    out: list[str] = []
    for item in order:
        if item not in by_prefix:
            out.append(item)
            continue
        out += [item + run for run in spans(by_prefix[item]).split(", ")]
    return out


AUTO_MIN_COLLECTORS = 10
"""`topology.collectors: auto` places at least this many (the default layout's count), so that
a world too small to give each role a rank runs the layout it ran before auto existed."""


def role_counts(cfg: TopologyConfig, world_size: int) -> dict[str, int]:
    """How many of each role the job places on `world_size` ranks."""
    others = 1 + cfg.param_servers + cfg.replay_shards + cfg.learners
    return {
        "commander": 1,
        "param_server": cfg.param_servers,
        "replay_shard": cfg.replay_shards,
        "learner": cfg.learners,
        "collector": collector_count(cfg, world_size - others),
    }


def collector_count(cfg: TopologyConfig, free_ranks: int) -> int:
    """An explicit count as it stands; auto fills the ranks the other roles leave free, with at
    least `AUTO_MIN_COLLECTORS` co-located where roles may share ranks (else at least one)."""
    if cfg.collectors != "auto":
        return cfg.collectors
    return max(free_ranks, AUTO_MIN_COLLECTORS if cfg.colocate else 1)


def build_topology(
    world_size: int,
    cfg: TopologyConfig,
    groups: dict[str, list[str]],
    hosts: Sequence[str] = (),
    gpus_per_host: Mapping[str, int] | None = None,
) -> Topology:
    """Place the roles of a job (training groups -> their policies) on `world_size` ranks;
    refuse what cannot be placed. `hosts` (each rank's host name, gathered at start) and
    `gpus_per_host` (None: unknown, no GPUs) place roles by host (`host_placement`); on one
    host, or with hosts unknown, roles take ranks in naming order."""
    counts = role_counts(cfg, world_size)
    needed = sum(counts.values())
    notes: list[str] = []
    if world_size < needed and not cfg.colocate:
        fewer = max(1, counts["collector"] - (needed - world_size))
        raise TopologyError(
            f"the job needs {needed} ranks ({_describe(counts)}) but the world has {world_size}",
            f"run with `mpirun -n {needed}`, set topology.colocate=true, or lower the role "
            f"counts (e.g. topology.collectors={fewer})",
        )
    if world_size < cfg.learners:
        notes.append(
            f"{cfg.learners} learners requested, {world_size} placed: data-parallel "
            "learners need a rank each"
        )
        counts["learner"] = world_size
    named = _role_names(counts)
    learners = [name for name, kind in named if kind == "learner"]
    by_learner, by_group = _assign_learners(learners, list(groups))
    gpus = gpus_per_host or {}
    if world_size < needed:
        rank_of = _colocate(named, world_size, hosts, gpus)
    elif len(set(hosts)) > 1:
        side_by_side = [name for members in by_group.values() for name in members]  # by group
        order = list(dict.fromkeys([*side_by_side, *learners]))
        rank_of = place_by_host(named, order, hosts, gpus)
    else:
        rank_of = {name: rank for rank, (name, _) in enumerate(named)}
    idle = sorted(set(range(world_size)) - set(rank_of.values()))
    if idle:
        notes.append(
            f"ranks {spans(idle)} host no role; set topology.collectors=auto (or raise it) "
            "to use them"
        )
    topology = Topology(world_size, rank_of, dict(named), dict(groups), by_learner, by_group, notes)
    topology.hosts = list(hosts)
    return topology


def _describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in counts.items())


def _role_names(counts: dict[str, int]) -> list[tuple[str, str]]:
    named = [("commander", "commander")]
    for kind in ("param_server", "replay_shard", "learner", "collector"):
        named += [(f"{ROLE_PREFIX[kind]}{i}", kind) for i in range(counts[kind])]
    return named


def _colocate(
    named: list[tuple[str, str]],
    world_size: int,
    hosts: Sequence[str],
    gpus_per_host: Mapping[str, int],
) -> dict[str, int]:
    """Greedy least-loaded placement; learners first so that each gets a rank of its own. Among
    ranks of equal load a learner prefers a host with a GPU no learner has taken yet, and every
    role the host of least load (so roles spread over hosts; on one host, the lowest rank)."""
    host = list(hosts) if len(hosts) == world_size else [""] * world_size
    load, host_load = [0.0] * world_size, defaultdict[str, float](float)
    learners_on = Counter[str]()
    rank_of = {"commander": 0}
    load[0] = ROLE_COST["commander"]  # not counted in its host's load: learner0 joins it

    def key(rank: int, kind: str) -> tuple[float, bool, float, int]:
        gpu_taken = kind != "learner" or learners_on[host[rank]] >= gpus_per_host.get(host[rank], 0)
        return (load[rank], gpu_taken, host_load[host[rank]], rank)

    for kind in ("learner", "collector", "replay_shard", "param_server"):
        for name in (n for n, k in named if k == kind):
            rank = min(range(world_size), key=lambda r: key(r, kind))
            rank_of[name] = rank
            load[rank] += ROLE_COST[kind]
            host_load[host[rank]] += ROLE_COST[kind]
            learners_on[host[rank]] += kind == "learner"
    return {name: rank_of[name] for name, _ in named}


def _assign_learners(
    learners: list[str], groups: list[str]
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Learners >= groups: each group gets data-parallel learners; else learners share out
    the groups."""
    by_learner: dict[str, list[str]] = {name: [] for name in learners}
    by_group: dict[str, list[str]] = {g: [] for g in groups}
    if len(learners) >= len(groups):
        for j, name in enumerate(learners):
            group = groups[j % len(groups)]
            by_learner[name].append(group)
            by_group[group].append(name)
    else:
        for i, group in enumerate(groups):
            name = learners[i % len(learners)]
            by_learner[name].append(group)
            by_group[group].append(name)
    return by_learner, by_group
