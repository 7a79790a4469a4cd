"""Placement by host, not by rank number: each role is given a host, then that host's lowest
free rank.

A batch system maps ranks to nodes in blocks (ranks 0-7 on node 1, 8-15 on node 2) or round
robin. Placed by rank number alone, a block-mapped job put the commander, servers, shards and
learners on node 1 and left node 2 only collectors, its GPUs idle. With each rank's host
gathered at start, one role per rank:
- the commander on rank 0, on the first host;
- learners one per GPU on the hosts that have GPUs, a group's learners side by side (one
  host's GPUs before the next host's); learners beyond the GPUs share them; with no GPU
  anywhere, learners are spread over the hosts;
- replay shard i beside learner i mod L (learners in group order), so that the shards a
  learner samples sit on its host;
- parameter servers spread over the hosts;
- collectors on the ranks left, spread over the hosts when they are fewer than those ranks.
To spread is to take the host that has the smallest share of its ranks given to that kind so
far, the first host on a tie: round robin over hosts of one size, in proportion over uneven
ones. One host, or hosts unknown, never comes here: roles then take ranks in naming order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence


class FreeRanks:
    """Each host's ranks not yet given a role, hosts in the order of their first rank."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self.ranks_of: dict[str, list[int]] = {}
        for rank, host in enumerate(hosts):
            self.ranks_of.setdefault(host, []).append(rank)
        self.size = {host: len(ranks) for host, ranks in self.ranks_of.items()}

    def open(self, among: Iterable[str] = ()) -> list[str]:
        """The hosts of `among` that have a free rank, or every such host when none of them
        has."""
        hosts = [host for host in among if self.ranks_of[host]]
        return hosts or [host for host, ranks in self.ranks_of.items() if ranks]

    def spread(self, placed: Counter[str], among: Iterable[str] = ()) -> str:
        """The open host with the smallest share of its ranks given to one kind (`placed`)."""
        return min(self.open(among), key=lambda host: placed[host] / self.size[host])

    def take(self, host: str, placed: Counter[str]) -> int:
        """`host`'s lowest free rank, counted in `placed`."""
        placed[host] += 1
        return self.ranks_of[host].pop(0)


def place_by_host(
    named: Sequence[tuple[str, str]],
    learners_by_group: Sequence[str],
    hosts: Sequence[str],
    gpus_per_host: Mapping[str, int],
) -> dict[str, int]:
    """The rank of every role, one role per rank. `named`: (name, kind) in naming order, no more
    roles than ranks; `learners_by_group`: the learners, a group's side by side; `hosts[r]`:
    rank r's host; `gpus_per_host`: GPUs by host name (a host not named has none)."""
    free = FreeRanks(hosts)
    rank_of = {"commander": free.take(hosts[0], Counter())}
    rank_of |= place_learners(learners_by_group, free, gpus_per_host)
    beside = [hosts[rank_of[name]] for name in learners_by_group]
    rank_of |= place_shards(names_of(named, "replay_shard"), beside, free)
    rank_of |= spread(names_of(named, "param_server"), free)
    rank_of |= spread(names_of(named, "collector"), free)
    return {name: rank_of[name] for name, _ in named}


def names_of(named: Sequence[tuple[str, str]], kind: str) -> list[str]:
    return [name for name, k in named if k == kind]


def place_learners(
    learners: Sequence[str], free: FreeRanks, gpus_per_host: Mapping[str, int]
) -> dict[str, int]:
    """One learner per GPU while a GPU is left, in host order; then on the GPU hosts, sharing
    their GPUs; with no GPU anywhere, spread over every host."""
    with_gpus = [host for host in free.ranks_of if gpus_per_host.get(host, 0) > 0]
    placed: Counter[str] = Counter()
    rank_of = {}
    for name in learners:
        unused = [h for h in free.open(with_gpus) if placed[h] < gpus_per_host.get(h, 0)]
        host = unused[0] if unused else free.spread(placed, with_gpus)
        rank_of[name] = free.take(host, placed)
    return rank_of


def place_shards(shards: Sequence[str], beside: Sequence[str], free: FreeRanks) -> dict[str, int]:
    """Shard i on the host of learner i mod L (`beside`: each learner's host), else spread."""
    placed: Counter[str] = Counter()
    rank_of = {}
    for i, name in enumerate(shards):
        near = [beside[i % len(beside)]] if beside else []
        rank_of[name] = free.take(free.spread(placed, near), placed)
    return rank_of


def spread(names: Sequence[str], free: FreeRanks) -> dict[str, int]:
    """Roles of one kind spread over the hosts, named in rank order (collector0 on the lowest
    rank they take)."""
    placed: Counter[str] = Counter()
    ranks = [free.take(free.spread(placed), placed) for _ in names]
    return dict(zip(names, sorted(ranks), strict=True))
