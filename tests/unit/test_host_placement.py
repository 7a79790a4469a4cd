"""Placement by host (`launch.host_placement`), a pure function tested with fake hosts and fake
GPU counts: ranks mapped in blocks (as a batch system maps them) put the commander, servers,
shards and both learners on host 1 and only collectors on host 2; now learners sit one per GPU
(or spread over the hosts without GPUs), shards beside them, servers spread, collectors on
every rank left. One host, or hosts unknown, keeps the placement by rank number."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from hpcmarl.config.loader import load_job
from hpcmarl.config.schema import TopologyConfig
from hpcmarl.launch import run
from hpcmarl.launch.build import probe_env
from hpcmarl.launch.memory import Node
from hpcmarl.launch.topology import Topology, build_topology

SHARED = {"shared": ["shared"]}
TWO_BY_EIGHT = ["hpc1"] * 8 + ["hpc2"] * 8


def on_host(topo: Topology, host: str) -> list[str]:
    return [name for name, rank in topo.rank_of.items() if topo.hosts[rank] == host]


def kinds_on(topo: Topology, host: str) -> Counter[str]:
    return Counter(topo.kind_of[name] for name in on_host(topo, host))


def host_of(topo: Topology, name: str) -> str:
    return topo.hosts[topo.rank_of[name]]


def assert_one_role_per_rank(topo: Topology) -> None:
    assert sorted(topo.rank_of.values()) == list(range(topo.world_size))
    assert topo.rank_of["commander"] == 0


def test_two_hosts_in_blocks_without_gpus_get_a_learner_and_its_shard_each() -> None:
    topo = build_topology(16, TopologyConfig(), SHARED, TWO_BY_EIGHT)
    assert_one_role_per_rank(topo)
    assert on_host(topo, "hpc1") == [
        "commander",
        "ps0",
        "replay0",
        "learner0",
        *(f"collector{i}" for i in range(4)),
    ]
    assert on_host(topo, "hpc2") == [
        "replay1",
        "learner1",
        *(f"collector{i}" for i in range(4, 10)),
    ]
    assert [topo.learner_slot(n) for n in ("learner0", "learner1")] == [0, 0]
    text = "\n".join(topo.host_lines(topo.hosts))
    assert text == (
        "  host hpc1: ranks 0-7 (commander, ps0, replay0, learner0, collector0-3)\n"
        "  host hpc2: ranks 8-15 (replay1, learner1, collector4-9)"
    )


def test_one_gpu_per_host_gives_each_host_one_learner_on_its_gpu() -> None:
    topo = build_topology(16, TopologyConfig(), SHARED, TWO_BY_EIGHT, {"hpc1": 1, "hpc2": 1})
    assert_one_role_per_rank(topo)
    assert [host_of(topo, f"learner{i}") for i in range(2)] == ["hpc1", "hpc2"]
    assert [host_of(topo, f"replay{i}") for i in range(2)] == ["hpc1", "hpc2"]
    assert [topo.learner_slot(f"learner{i}") for i in range(2)] == [0, 0]


def test_two_gpus_per_host_keep_a_groups_learners_together_one_per_gpu() -> None:
    topo = build_topology(16, TopologyConfig(), SHARED, TWO_BY_EIGHT, {"hpc1": 2, "hpc2": 2})
    assert_one_role_per_rank(topo)
    assert [host_of(topo, f"learner{i}") for i in range(2)] == ["hpc1", "hpc1"]
    assert [topo.learner_slot(f"learner{i}") for i in range(2)] == [0, 1]  # cuda:0, cuda:1
    assert [host_of(topo, f"replay{i}") for i in range(2)] == ["hpc1", "hpc1"]
    assert kinds_on(topo, "hpc2") == {"collector": 8}


def test_learners_go_to_the_host_that_has_the_gpus() -> None:
    topo = build_topology(16, TopologyConfig(), SHARED, TWO_BY_EIGHT, {"hpc1": 0, "hpc2": 2})
    assert_one_role_per_rank(topo)
    assert kinds_on(topo, "hpc2") == {"learner": 2, "replay_shard": 2, "collector": 4}
    assert [topo.learner_slot(f"learner{i}") for i in range(2)] == [0, 1]
    assert on_host(topo, "hpc1")[:2] == ["commander", "ps0"]


def test_two_groups_on_two_hosts_of_two_gpus_each_train_on_a_host_each() -> None:
    groups = {"a": ["a"], "b": ["b"]}
    topo = build_topology(
        16, TopologyConfig(learners=4), groups, TWO_BY_EIGHT, {"hpc1": 2, "hpc2": 2}
    )
    assert topo.learners_of_group == {"a": ["learner0", "learner2"], "b": ["learner1", "learner3"]}
    assert {host_of(topo, n) for n in topo.learners_of_group["a"]} == {"hpc1"}
    assert {host_of(topo, n) for n in topo.learners_of_group["b"]} == {"hpc2"}
    assert sorted(topo.learner_slot(n) for n in topo.learners_of_group["b"]) == [0, 1]


def test_more_learners_than_gpus_share_the_gpus_of_their_hosts() -> None:
    topo = build_topology(
        16, TopologyConfig(learners=4), SHARED, TWO_BY_EIGHT, {"hpc1": 1, "hpc2": 1}
    )
    assert Counter(host_of(topo, f"learner{i}") for i in range(4)) == {"hpc1": 2, "hpc2": 2}
    assert sorted(topo.learner_slot(f"learner{i}") for i in range(4)) == [0, 0, 1, 1]


def test_four_hosts_spread_learners_servers_and_collectors() -> None:
    hosts = [f"n{r // 8 + 1}" for r in range(32)]
    cfg = TopologyConfig(learners=4, param_servers=2, replay_shards=4)
    topo = build_topology(32, cfg, {"a": ["a"], "b": ["b"]}, hosts)
    assert_one_role_per_rank(topo)
    for host in ("n1", "n2", "n3", "n4"):
        kinds = kinds_on(topo, host)
        assert kinds["learner"] == 1 and kinds["replay_shard"] == 1 and kinds["collector"] >= 4
    assert {host_of(topo, "ps0"), host_of(topo, "ps1")} == {"n1", "n2"}
    for i in range(4):  # shard i beside learner i (a group's learners first)
        assert host_of(topo, f"replay{i}") == host_of(
            topo, ["learner0", "learner2", "learner1", "learner3"][i]
        )


def test_uneven_hosts_each_get_a_learner_and_collectors_fill_the_rest() -> None:
    hosts = ["small"] * 3 + ["big"] * 13
    topo = build_topology(16, TopologyConfig(), SHARED, hosts)
    assert_one_role_per_rank(topo)
    assert kinds_on(topo, "small") == {"commander": 1, "learner": 1, "replay_shard": 1}
    assert kinds_on(topo, "big") == {
        "learner": 1,
        "replay_shard": 1,
        "param_server": 1,
        "collector": 10,
    }


def test_explicit_collectors_spread_over_the_hosts_and_idle_ranks_are_named() -> None:
    cfg = TopologyConfig(collectors=4, learners=1, replay_shards=1)
    topo = build_topology(16, cfg, SHARED, ["a"] * 8 + ["b"] * 8)
    assert kinds_on(topo, "a")["collector"] == 2 and kinds_on(topo, "b")["collector"] == 2
    assert topo.notes == [
        "ranks 6-7, 10-15 host no role; set topology.collectors=auto (or raise it) to use them"
    ]


def test_blocks_and_round_robin_place_the_same_roles_on_each_host() -> None:
    blocks = build_topology(16, TopologyConfig(), SHARED, TWO_BY_EIGHT)
    robin = build_topology(16, TopologyConfig(), SHARED, ["hpc1", "hpc2"] * 8)
    assert_one_role_per_rank(robin)
    for host in ("hpc1", "hpc2"):
        assert kinds_on(blocks, host) == kinds_on(robin, host)


@pytest.mark.parametrize("gpus", [None, {"h": 4}])
@pytest.mark.parametrize(
    "cfg",
    [TopologyConfig(), TopologyConfig(replay_shards=1, learners=1, collectors=2, colocate=False)],
)
def test_one_host_or_unknown_hosts_keep_the_placement_by_rank_number(
    cfg: TopologyConfig, gpus: dict[str, int] | None
) -> None:
    world = 16 if cfg.collectors == "auto" else 6
    by_number = build_topology(world, cfg, SHARED)
    assert build_topology(world, cfg, SHARED, ["h"] * world, gpus).rank_of == by_number.rank_of
    assert list(by_number.rank_of.values()) == list(range(world))  # commander, ps0, replay0, ...


def test_a_colocated_world_on_two_hosts_puts_a_learner_on_each_and_prefers_gpus() -> None:
    hosts = ["hpc1"] * 4 + ["hpc2"] * 4
    topo = build_topology(8, TopologyConfig(), SHARED, hosts)
    assert [host_of(topo, f"learner{i}") for i in range(2)] == ["hpc1", "hpc2"]
    assert topo.rank_of["commander"] == 0 and len(topo.names("collector")) == 10
    assert {host_of(topo, n) for n in topo.names("collector")} == {"hpc1", "hpc2"}
    on_gpus = build_topology(8, TopologyConfig(), SHARED, hosts, {"hpc2": 2})
    assert [host_of(on_gpus, f"learner{i}") for i in range(2)] == ["hpc2", "hpc2"]
    assert (
        build_topology(8, TopologyConfig(), SHARED).rank_of
        == build_topology(8, TopologyConfig(), SHARED, ["hpc1"] * 8).rank_of
    )


def test_rank_0_checks_the_placement_by_host_that_every_rank_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 placed the roles without hosts for its checks (replay shards on ranks 2-3, host 1)
    while every rank built them by host (replay1 on host 2): a host 2 too small for a shard's
    table passed the memory check."""
    monkeypatch.chdir(tmp_path)
    nodes = [("hpc1", 64 << 30)] * 8 + [("hpc2", 2 << 30)] * 8
    overrides = ["replay.table_capacity=100000000", f"runtime.run_dir={tmp_path / 'run'}"]
    outcome = run.plan_on_rank0(None, overrides, nodes)
    assert outcome[0] == "error", outcome
    assert "memory on node hpc2 (ranks [8, 9, 10, 11, 12, 13, 14, 15])" in outcome[1]
    assert os.listdir(tmp_path) == []


def test_the_census_gpus_place_learners_unless_they_train_on_the_cpu() -> None:
    cfg = load_job(None, [])
    spec = probe_env(cfg)
    nodes = [Node("hpc1", 64 << 30, 8, 0)] * 8 + [Node("hpc2", 64 << 30, 8, 2)] * 8
    topo = run.place(cfg, spec, nodes)
    assert [host_of(topo, f"learner{i}") for i in range(2)] == ["hpc2", "hpc2"]
    assert [topo.learner_slot(f"learner{i}") for i in range(2)] == [0, 1]  # cuda:0, cuda:1
    cfg.learner.device = "cpu"
    topo = run.place(cfg, spec, nodes)
    assert [host_of(topo, f"learner{i}") for i in range(2)] == ["hpc1", "hpc2"]
