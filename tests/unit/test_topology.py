"""The wiring diagram at world sizes 1 to 128 (collectors: auto fills the world), and the refusal
of a world too small."""

from __future__ import annotations

import pytest

from hpcmarl.config.schema import TopologyConfig
from hpcmarl.errors import TopologyError
from hpcmarl.launch.topology import build_topology, spans


def test_default_layout_on_16_ranks_is_one_role_per_rank() -> None:
    topo = build_topology(16, TopologyConfig(), {"shared": ["shared"]})
    assert topo.rank_of["commander"] == 0
    assert topo.rank_of["ps0"] == 1
    assert [topo.rank_of[f"replay{i}"] for i in range(2)] == [2, 3]
    assert [topo.rank_of[f"learner{i}"] for i in range(2)] == [4, 5]
    assert sorted(topo.rank_of[f"collector{i}"] for i in range(10)) == list(range(6, 16))
    assert all(len(topo.roles_on(r)) == 1 for r in range(16))
    assert topo.learners_of_group == {"shared": ["learner0", "learner1"]}


@pytest.mark.parametrize("world", [1, 2, 5])
def test_small_worlds_colocate_every_role(world: int) -> None:
    topo = build_topology(world, TopologyConfig(), {"shared": ["shared"]})
    assert set(topo.rank_of.values()) <= set(range(world))
    assert topo.rank_of["commander"] == 0
    assert len(topo.names("collector")) == 10
    learners = topo.names("learner")
    assert len(learners) == min(2, world)
    assert len({topo.rank_of[name] for name in learners}) == len(learners)
    assert "commander" in topo.format()


def test_one_process_hosts_everything_with_one_learner() -> None:
    topo = build_topology(1, TopologyConfig(), {"shared": ["shared"]})
    assert set(topo.rank_of.values()) == {0}
    assert topo.names("learner") == ["learner0"]
    assert any("learners requested" in note for note in topo.notes)


def test_five_ranks_spread_collectors_evenly() -> None:
    topo = build_topology(5, TopologyConfig(), {"shared": ["shared"]})
    per_rank = [sum(1 for n in topo.roles_on(r) if n.startswith("collector")) for r in range(5)]
    assert max(per_rank) - min(per_rank) <= 2


def test_world_too_small_without_colocation_names_the_fix() -> None:
    with pytest.raises(TopologyError) as err:
        build_topology(5, TopologyConfig(collectors=10, colocate=False), {"shared": ["shared"]})
    text = str(err.value)
    assert "needs 16 ranks" in text and "world has 5" in text and "mpirun -n 16" in text


def test_auto_without_colocation_needs_one_collector_rank() -> None:
    with pytest.raises(TopologyError) as err:
        build_topology(5, TopologyConfig(colocate=False), {"shared": ["shared"]})
    assert "needs 7 ranks" in str(err.value) and "mpirun -n 7" in str(err.value)
    topo = build_topology(12, TopologyConfig(colocate=False), {"shared": ["shared"]})
    assert len(topo.names("collector")) == 6
    assert all(len(topo.roles_on(r)) == 1 for r in range(12))


@pytest.mark.parametrize("world", [16, 17, 32, 128])
def test_auto_collectors_fill_every_rank_left(world: int) -> None:
    topo = build_topology(world, TopologyConfig(), {"shared": ["shared"]})
    assert len(topo.names("collector")) == world - 6
    assert all(len(topo.roles_on(r)) == 1 for r in range(world))
    assert topo.rank_of["commander"] == 0 and topo.notes == []


@pytest.mark.parametrize("world", [8, 12])
def test_auto_collectors_in_a_small_world_keep_the_default_count(world: int) -> None:
    topo = build_topology(world, TopologyConfig(), {"shared": ["shared"]})
    assert len(topo.names("collector")) == 10
    assert all(topo.roles_on(r) for r in range(world))


def test_explicit_collectors_stay_as_counted_on_a_larger_world() -> None:
    topo = build_topology(32, TopologyConfig(collectors=3), {"shared": ["shared"]})
    assert len(topo.names("collector")) == 3
    assert topo.roles_on(9) == [] and "ranks 9-31 host no role" in topo.notes[0]
    assert "topology.collectors=auto" in topo.notes[0]


def test_independent_policies_share_out_learners() -> None:
    topo = build_topology(16, TopologyConfig(), {a: [a] for a in ("agent_0", "agent_1", "agent_2")})
    assert topo.groups_of_learner == {"learner0": ["agent_0", "agent_2"], "learner1": ["agent_1"]}
    assert topo.group_color(4) is None


def test_data_parallel_groups_get_a_communicator_color() -> None:
    topo = build_topology(16, TopologyConfig(learners=4), {"a": ["a"], "b": ["b"]})
    assert topo.learners_of_group == {"a": ["learner0", "learner2"], "b": ["learner1", "learner3"]}
    colors = {topo.group_color(topo.rank_of[f"learner{i}"]) for i in range(4)}
    assert colors == {0, 1}
    assert topo.group_color(0) is None


def test_extra_ranks_are_reported_idle() -> None:
    topo = build_topology(18, TopologyConfig(collectors=10), {"shared": ["shared"]})
    assert topo.roles_on(17) == []
    assert any("host no role" in note for note in topo.notes)


def test_wiring_names_each_hosts_ranks_and_roles() -> None:
    text = build_topology(
        8, TopologyConfig(), {"shared": ["shared"]}, ["hpc1"] * 4 + ["hpc2"] * 4
    ).format()
    assert "  host hpc1: ranks 0-3 (commander, replay0, learner0, collector0, collector2, " in text
    assert "  host hpc2: ranks 4-7 (ps0, replay1, learner1, collector1, collector3-4, " in text
    assert "host" not in build_topology(8, TopologyConfig(), {"shared": ["shared"]}).format()


def test_host_lines_of_128_ranks_on_4_nodes_in_blocks_and_round_robin() -> None:
    topo = build_topology(128, TopologyConfig(), {"shared": ["shared"]})
    blocks = topo.host_lines([f"node{r // 32 + 1}" for r in range(128)])
    assert blocks == [
        "  host node1: ranks 0-31 (commander, ps0, replay0-1, learner0-1, collector0-25)",
        "  host node2: ranks 32-63 (collector26-57)",
        "  host node3: ranks 64-95 (collector58-89)",
        "  host node4: ranks 96-127 (collector90-121)",
    ]
    alternate = topo.host_lines([f"node{r % 2 + 1}" for r in range(128)])
    assert (
        alternate[1]
        == "  host node2: ranks 1-127 step 2 (ps0, replay1, learner1, collector1-121 step 2)"
    )


def test_spans_write_runs_and_strides() -> None:
    assert spans([0, 1, 2, 3, 8, 10, 11]) == "0-3, 8, 10-11"
    assert spans([7]) == "7" and spans([2, 4]) == "2, 4" and spans([1, 3, 4, 5]) == "1, 3-5"


def test_a_learners_slot_counts_the_learners_on_its_host() -> None:
    cfg, groups = TopologyConfig(learners=4, collectors=2), {"s": ["s"]}
    in_blocks = ["hpc1"] * 5 + ["hpc2"] * 5
    topo = build_topology(10, cfg, groups, in_blocks)
    assert [topo.rank_of[f"learner{i}"] for i in range(4)] == [1, 5, 2, 6]  # spread by host
    assert [topo.learner_slot(f"learner{i}") for i in range(4)] == [0, 0, 1, 1]
    topo = build_topology(10, cfg, groups, ["hpc1", "hpc2"] * 5)
    assert [topo.learner_slot(f"learner{i}") for i in range(4)] == [0, 0, 1, 1]
    topo = build_topology(10, cfg, groups, ["hpc1"] * 10)
    assert [topo.rank_of[f"learner{i}"] for i in range(4)] == [4, 5, 6, 7]
    assert [topo.learner_slot(f"learner{i}") for i in range(4)] == [0, 1, 2, 3]
    unknown = build_topology(10, cfg, groups)  # one process: no hosts gathered
    assert [unknown.learner_slot(f"learner{i}") for i in range(4)] == [0, 0, 0, 0]
