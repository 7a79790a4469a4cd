"""Will the job fit in memory? An estimate made on rank 0 before any rank allocates.

A replay table preallocates `replay.table_capacity` rows per column on its first insert, and a
prioritized one a sum tree at construction; networks hold weights, gradients and optimizer
moments. A job that asks for more than a node holds would otherwise be killed by the kernel (or
the batch system's cgroup) minutes into the run, with no line saying why. So rank 0 adds up, per
node, what the roles placed there will hold and refuses a job that does not fit, naming the
figure and the key to change. The figures are upper bounds of what the roles hold; what Python,
torch and the environments themselves take is already spent when the available memory is read.
"""

from __future__ import annotations

import math
import os
import socket
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..algos import registry
from ..algos.contract import PolicySpec
from ..config.schema import JobConfig
from ..core import policy_key
from ..errors import ConfigError
from ..items.spec import ItemSpec
from ..population import server_for
from ..replay.compact import StorageForm, stored_bytes_per_row
from ..replay.compact_items import COMPACT_KINDS, stored_item_bytes
from .topology import Topology

if TYPE_CHECKING:
    from .build import EnvSpec

GIB = float(1 << 30)
LEARNER_COPIES = 6
"""Network copies a learner holds per parameter: weights, target (or old policy), gradients,
Adam's two moments, and the flat vector it averages and pushes."""
SERVED_COPIES = 2
"""Copies a parameter server or a collector holds: the weights and the message carrying them."""
TREE_BYTES_PER_SLOT = 16
"""A prioritized table's sum tree: float64 leaves and inner nodes, 2 x capacity rounded up to a
power of two."""

FULL_ROWS = StorageForm()


class Node(NamedTuple):
    """What one rank reports at start (`gather_nodes`): the census that the memory check, the
    checks across hosts (hosts.py) and placement read, gathered once."""

    host: str
    available: int
    """Bytes it can still allocate (`available_bytes`)."""
    cores: int = 1
    """CPUs this process may run on: its affinity mask, a batch step's share of the node."""
    gpus: int = 0
    """CUDA devices torch sees here (0 with a CPU build of torch)."""
    cuda_build: bool = False
    """torch here is built with CUDA (False: no GPU can ever be used on this host)."""


@dataclass
class NodeNeed:
    """What the roles placed on one node will hold, in bytes."""

    host: str
    ranks: list[int]
    available: int
    tables: int = 0
    networks: int = 0
    per_item: int = 0
    """At most the bytes one more item of `replay.table_capacity` costs on this node."""

    @property
    def total(self) -> int:
        return self.tables + self.networks


def this_node() -> Node:
    """This process's host, the bytes it can still allocate, its cores and its GPUs.

    torch is imported by the launch code already, and `torch.cuda.device_count` asks NVML
    first (no CUDA context, no fork poisoning). The whole census took 0.8 ms here, with a CPU
    build of torch."""
    import torch

    gpus = torch.cuda.device_count()
    return Node(
        socket.gethostname(), available_bytes(), cores(), gpus, torch.version.cuda is not None
    )


def cores() -> int:
    """CPUs this process may run on (a cgroup's or a launcher's binding), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def gather_nodes(comm: Any) -> list[Node]:
    """Every rank's `Node`, by rank: one small allgather at start-up, so rank 0 can tell which
    ranks share a node and what each node has."""
    node = this_node()
    return [node] if comm is None else list(comm.allgather(node))


def available_bytes() -> int:
    """MemAvailable (what can be allocated without swapping), lowered to what a cgroup limit
    leaves (a Slurm job step is confined to its share of the node)."""
    free = _meminfo_available()
    if free is None:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cgroup = _cgroup_headroom()
    return free if cgroup is None else min(free, cgroup)


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


_CGROUP_FILES = (
    ("memory.max", "memory.current", "inactive_file"),  # cgroup v2
    ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),  # cgroup v1
)
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cgroup_headroom() -> int | None:
    """What the tightest memory cgroup of this process still allows, if any is limited: its
    limit less its usage, page cache that can be reclaimed not counted as used. The process's
    own cgroup (a Slurm step's) and each ancestor (the job's) are read; inside a container the
    mount's root is the process's own."""
    found = []
    for own in _own_cgroup_dirs():
        for folder in (own, *own.parents):
            if folder == _CGROUP_ROOT.parent:
                break
            rooms = (_headroom(folder, *files) for files in _CGROUP_FILES)
            found += [room for room in rooms if room is not None]
    return min(found, default=None)


def _own_cgroup_dirs() -> list[Path]:
    dirs = []
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "" or "memory" in controllers.split(","):
                sub = _CGROUP_ROOT if controllers == "" else _CGROUP_ROOT / "memory"
                dirs.append(sub / path.lstrip("/"))
    except (OSError, ValueError):
        pass
    return dirs or [_CGROUP_ROOT, _CGROUP_ROOT / "memory"]


def _headroom(folder: Path, limit_file: str, usage_file: str, cache_key: str) -> int | None:
    try:
        limit_text = (folder / limit_file).read_text().strip()
        if limit_text == "max" or int(limit_text) >= 1 << 60:
            return None
        usage = int((folder / usage_file).read_text())
        stat = (folder / "memory.stat").read_text().split()
        cache = int(dict(zip(stat[::2], stat[1::2], strict=False)).get(cache_key, "0"))
        return max(0, int(limit_text) - usage + cache)
    except (OSError, ValueError):
        return None


def row_bytes(item: ItemSpec, form: StorageForm = FULL_ROWS) -> int:
    """Bytes one item's columns take in a table, transitions stored in `form`."""
    if item.kind == "transition" and form.compact:
        return stored_bytes_per_row({c.name: (c.dtype, c.shape) for c in item.columns}, form)
    if item.kind in COMPACT_KINDS and form.compact:
        return stored_item_bytes(item, form)
    return sum(math.prod(item.item_shape(c)) * np.dtype(c.dtype).itemsize for c in item.columns)


def storage_line(items: dict[str, ItemSpec], form: StorageForm) -> str | None:
    """The start-up line on what a stored transition (one agent's step) costs in the replay
    tables, or None for on-policy queues. An episode or sequence item of T steps and N agents
    holds T x N of them (an episode's padding counted as stored)."""
    replayed = [item for item in items.values() if not item.replay.on_policy]
    if not replayed:
        return None
    per_item = [item.length * item.agents if item.joint else 1 for item in replayed]
    stored = sum(row_bytes(i, form) / n for i, n in zip(replayed, per_item, strict=True))
    full = sum(row_bytes(i) / n for i, n in zip(replayed, per_item, strict=True))
    stored, full = round(stored / len(replayed)), round(full / len(replayed))
    how = (
        f" ({form.describe()}: {stored / full:.2f} of {full} B in full rows)"
        if stored != full
        else ""
    )
    return f"hpcmarl: replay stores {stored} B per transition{how}"


def table_bytes(item: ItemSpec, capacity: int, form: StorageForm = FULL_ROWS) -> tuple[int, int]:
    """(bytes of one table of `capacity` items as a shard allocates them, at most bytes per
    item: its columns and, when prioritized, up to two tree slots)."""
    row = row_bytes(item, form)
    if item.replay.selector != "prioritized":
        return capacity * row, row
    tree = TREE_BYTES_PER_SLOT * (1 << (capacity - 1).bit_length())
    return capacity * row + tree, row + 2 * TREE_BYTES_PER_SLOT


def mlp_params(in_dim: int, hidden: Sequence[int], out_dim: int) -> int:
    """Weights and biases of an MLP, counted without building it (it may be too large)."""
    widths = [in_dim, *hidden, out_dim]
    return sum((a + 1) * b for a, b in zip(widths, widths[1:], strict=False))


def policy_params(cfg: JobConfig, spec: EnvSpec) -> dict[str, int]:
    """policy -> parameters of its actor (an agent-index input included), plus the critic for
    on-policy algorithms. The `mlp` torso's are counted from its widths without building it
    (it may be too large); any other torso's are those of the network itself (`built_params`)."""
    if cfg.learner.model.torso != "mlp":
        return built_params(cfg, spec)
    hidden = cfg.learner.hidden_sizes
    on_policy = registry.decl_of(cfg.learner.algo).on_policy
    out = {}
    for policy in spec.policies:
        obs, actions = spec.policy_dims(policy)
        agents = sum(1 for a in spec.agents if spec.policy_of[a] == policy)
        out[policy] = mlp_params(obs + agents, hidden, actions)
        if on_policy:
            out[policy] += _state_critic(cfg, spec, obs)
    return out


def built_params(cfg: JobConfig, spec: EnvSpec) -> dict[str, int]:
    """policy -> parameters of the network `networks.policy_network` builds from the policy's
    spec (a torso is a user's module of any size: no formula knows it), counted on rank 0 as
    the algorithm's `policy_specs` lays it out (or built here, where a spec lists none). An
    on-policy critic counts as the larger of that network (a critic reading observations has
    the same torso) and an MLP of the global state."""
    on_policy = registry.decl_of(cfg.learner.algo).on_policy
    out = {}
    for group in spec.training_groups():
        group_spec = spec.group_spec(group, cfg.agents.strategy_spec_id)
        specs = registry.policy_specs(cfg, group_spec)
        for policy, key in group_spec.keys.items():
            actor = specs[key].size or _network_params(specs[key])
            critic = max(actor, _state_critic(cfg, spec, spec.policy_dims(policy)[0]))
            out[policy] = actor + critic if on_policy else actor
    return out


def _state_critic(cfg: JobConfig, spec: EnvSpec, obs: int) -> int:
    """An MLP critic of the state (or the observation) and the agent index."""
    width = max(obs, spec.state_dim) + len(spec.agents)
    return mlp_params(width, cfg.learner.hidden_sizes, 1)


def _network_params(policy: PolicySpec) -> int:
    import torch

    from ..algos.networks import num_params, policy_network

    with torch.random.fork_rng(devices=[]):  # rank 0's generator seeds the run
        return num_params(policy_network(policy))


def node_needs(
    cfg: JobConfig, spec: EnvSpec, topology: Topology, nodes: Sequence[Node]
) -> list[NodeNeed]:
    """Bytes each node's roles will hold; `nodes[r]` is what rank r reported."""
    from .build import item_specs, storage_form

    capacity, form = cfg.replay.table_capacity, storage_form(cfg)
    shard_bytes, shard_row = 0, 0
    for item in item_specs(cfg, spec).values():
        full, row = table_bytes(item, capacity, form)
        shard_bytes, shard_row = shard_bytes + full, shard_row + row
    params = policy_params(cfg, spec)
    weights = 4 * sum(params.values())  # float32
    servers = topology.names("param_server")
    served: dict[str, int] = defaultdict(int)
    for policy, n in params.items():
        served[server_for(policy_key(cfg.agents.strategy_spec_id, policy), servers)] += 4 * n
    by_host: dict[str, NodeNeed] = {}
    for rank, (host, available, *_) in enumerate(nodes):
        need = by_host.setdefault(host, NodeNeed(host, [], available))
        need.ranks.append(rank)
        need.available = min(need.available, available)
    for name, rank in topology.rank_of.items():
        need = by_host[nodes[rank][0]]
        kind = topology.kind_of[name]
        if kind == "replay_shard":
            need.tables += shard_bytes
            need.per_item += shard_row
        elif kind == "learner":
            trained = topology.groups_of_learner[name]
            group_params = sum(params[p] for g in trained for p in topology.groups[g])
            need.networks += 4 * LEARNER_COPIES * group_params
        elif kind == "param_server":
            need.networks += SERVED_COPIES * served[name]
        elif kind == "collector":
            need.networks += SERVED_COPIES * weights
    return list(by_host.values())


def check_memory(cfg: JobConfig, spec: EnvSpec, topology: Topology, nodes: Sequence[Node]) -> None:
    """Refuse a job whose replay tables and networks need more memory than a node has."""
    needs = node_needs(cfg, spec, topology, nodes)
    for need in needs:
        if need.total > need.available:
            where = "this node" if len(needs) == 1 else f"node {need.host} (ranks {need.ranks})"
            raise ConfigError(_cause(need, where), _fix(cfg, need))


def _cause(need: NodeNeed, where: str) -> str:
    return (
        f"the job needs {need.total / GIB:.1f} GiB of memory on {where} (replay tables "
        f"{need.tables / GIB:.1f} GiB, networks {need.networks / GIB:.1f} GiB), which has "
        f"{need.available / GIB:.1f} GiB available"
    )


def _fix(cfg: JobConfig, need: NodeNeed) -> str:
    if need.tables >= need.networks and need.per_item:
        fits = max(0, need.available - need.networks) // need.per_item
        return (
            f"lower replay.table_capacity (now {cfg.replay.table_capacity:,}; about "
            f"{fits:,} fits), place fewer replay shards per node (topology.replay_shards, or "
            "more nodes), or free memory on the node"
        )
    model = cfg.learner.model
    shrink = (
        f"lower learner.hidden_sizes (now {cfg.learner.hidden_sizes})"
        if model.torso == "mlp"
        else f"shrink the torso {model.torso} (learner.model.kwargs, now {dict(model.kwargs)})"
    )
    return (
        f"{shrink}, place fewer learners and collectors per node (more nodes), or free memory "
        "on the node"
    )
