"""Start-up checks across hosts (launch/hosts.py), on one host with real files: a host whose
probe rank 0 does not find writes into another directory of the same name; a host where the run
directory or the dataset is missing cannot see it. GPUs come from the census (fake counts here:
the check is a pure function of it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcmarl.config.schema import TopologyConfig
from hpcmarl.errors import ConfigError
from hpcmarl.launch.hosts import (
    check_cuda_hosts,
    dataset_readers,
    judge,
    probe_host,
    probing_ranks,
    remove_probe,
)
from hpcmarl.launch.memory import Node, this_node
from hpcmarl.launch.preflight import unmake_run_dir
from hpcmarl.launch.topology import build_topology

FIX = "; fix: put runtime.run_dir on a filesystem every node mounts"
TWO_HOSTS = [Node("hpc1", 1 << 34)] * 4 + [Node("hpc2", 1 << 34)] * 4


def test_a_host_that_writes_its_probe_elsewhere_or_finds_no_run_dir_is_named(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"  # what rank 0 made and sees
    run_dir.mkdir()
    own_disk = tmp_path / "hpc2-local" / "run"  # the same name on hpc2's own disk
    own_disk.mkdir(parents=True)
    reports = [
        probe_host(str(run_dir), "hpc1", 0),
        probe_host(str(own_disk), "hpc2", 4),
        probe_host(str(tmp_path / "unmounted" / "run"), "hpc3", 8),
    ]
    line = judge(str(run_dir), reports, "")
    assert line == (
        f"the run directory {run_dir} is not shared: hpc2 cannot see it (rank 4 wrote "
        f"{own_disk}/.probe-hpc2, rank 0 does not find it); hpc3 cannot see it (rank 8: No "
        f"such file or directory: {tmp_path}/unmounted/run/.probe-hpc3){FIX} (a shared home, "
        "project or parallel filesystem; not /tmp or a node-local disk), as an absolute path"
    )
    for report in reports:
        remove_probe(report.probe)
    assert os.listdir(run_dir) == [] and os.listdir(own_disk) == []


def test_a_shared_run_dir_passes_and_a_stale_probe_does_not_stand_in(tmp_path: Path) -> None:
    reports = [probe_host(str(tmp_path), host, rank) for rank, host in ((0, "hpc1"), (4, "hpc2"))]
    assert judge(str(tmp_path), reports, "") is None
    (tmp_path / ".probe-hpc2").write_text("hpc2 rank 4 pid 1\n")  # an earlier job's
    line = judge(str(tmp_path), reports, "")
    assert line is not None and "hpc2 cannot see it (rank 4 wrote" in line
    assert "hpc1" not in line.split("not shared:")[1]


def test_one_rank_per_host_probes_and_the_shards_hosts_read_the_dataset() -> None:
    assert probing_ranks(TWO_HOSTS) == {0: "hpc1", 4: "hpc2"}
    assert probing_ranks([Node("b", 1), Node("a", 1), Node("b", 1)]) == {0: "b", 1: "a"}
    topology = build_topology(8, TopologyConfig(), {"p0": ["p0"]}, [n.host for n in TWO_HOSTS])
    readers = dataset_readers(topology, TWO_HOSTS)
    shards = topology.names("replay_shard")
    assert sorted(name for names in readers.values() for name in names) == sorted(shards)
    for host, names in readers.items():
        assert all(TWO_HOSTS[topology.rank_of[name]].host == host for name in names)


def test_a_dataset_a_shards_host_cannot_read_is_named(tmp_path: Path) -> None:
    dataset = tmp_path / "data.h5"
    dataset.write_bytes(b"\x89HDF\r\n\x1a\n")
    seen = probe_host(str(tmp_path), "hpc1", 0, str(dataset))
    assert seen.dataset_error == "" and judge(str(tmp_path), [seen], str(dataset)) is None
    missing = tmp_path / "hpc2-view" / "data.h5"
    unseen = probe_host(str(tmp_path), "hpc2", 4, str(missing))
    line = judge(str(tmp_path), [seen, unseen], str(missing))
    assert line == (
        f"offline.dataset = '{missing}' cannot be read on the host of a replay shard: hpc2 "
        f"(rank 4: No such file or directory: {missing}); fix: put the dataset on a filesystem "
        "every node mounts (or copy it to the same path on each node that hosts a replay shard)"
    )
    empty_run = tmp_path / "empty-run"
    empty_run.mkdir()
    line = judge(str(tmp_path), [probe_host(str(tmp_path), "hpc2", 4, str(empty_run))], "x")
    assert line is not None and "hpc2 (rank 4: " in line and "holds no replay files" in line
    for report in (seen, unseen):
        remove_probe(report.probe)


def test_cuda_is_refused_naming_each_learner_host_without_a_gpu() -> None:
    hosts = [n.host for n in TWO_HOSTS]
    topology = build_topology(8, TopologyConfig(learners=4), {"p0": ["p0"]}, hosts)
    learner_hosts = {hosts[topology.rank_of[name]] for name in topology.names("learner")}
    gpus = {"hpc1": 2, "hpc2": 2}
    nodes = [Node(n.host, n.available, 8, gpus[n.host], True) for n in TWO_HOSTS]
    check_cuda_hosts("cuda", topology, nodes)  # GPUs on both: granted
    nodes = [Node(n.host, n.available, 8, 0, n.host == "hpc2") for n in TWO_HOSTS]
    with pytest.raises(ConfigError) as refused:
        check_cuda_hosts("cuda", topology, nodes)
    line = refused.value.message()
    assert line.startswith("learner.device is cuda, but a learner's host has no GPU: ")
    assert line.endswith(
        "; fix: set learner.device=auto or cpu, or run the learners on nodes "
        "with a GPU and a CUDA build of torch"
    )
    for name in topology.names("learner"):
        assert f"{name} on rank {topology.rank_of[name]}" in line
    why = {"hpc1": "a CPU build of torch", "hpc2": "no CUDA device visible"}
    for host in learner_hosts:
        assert f"{host} ({why[host]}; learner" in line
    check_cuda_hosts("auto", topology, nodes)  # auto falls back to the CPU


def test_cuda_on_one_node_without_a_gpu_says_this_node() -> None:
    topology = build_topology(1, TopologyConfig(), {"p0": ["p0"]}, ["vm"])
    with pytest.raises(ConfigError, match=r"cuda, but this node has a CPU build of torch; fix"):
        check_cuda_hosts("cuda", topology, [Node("vm", 1 << 34, 2, 0, False)])


def test_the_census_counts_this_hosts_cores_and_gpus() -> None:
    node = this_node()
    assert node.cores == len(os.sched_getaffinity(0))
    assert node.gpus >= 0 and (node.gpus == 0 or node.cuda_build)


def test_a_run_dir_refused_by_a_host_is_removed_only_if_this_start_made_it(
    tmp_path: Path,
) -> None:
    from hpcmarl.config.schema import JobConfig
    from hpcmarl.launch.preflight import create_run_dir

    made = create_run_dir(JobConfig(), str(tmp_path / "a" / "run"))
    assert made == [str(tmp_path / "a" / "run"), str(tmp_path / "a")]
    unmake_run_dir(str(tmp_path / "a" / "run"), made)
    assert os.listdir(tmp_path) == []
    (tmp_path / "mine").mkdir()
    kept = create_run_dir(JobConfig(), str(tmp_path / "mine"))
    unmake_run_dir(str(tmp_path / "mine"), kept)
    assert kept == [] and (tmp_path / "mine" / "config.yaml").exists()
