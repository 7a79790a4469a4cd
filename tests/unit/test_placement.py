"""Device choice for learners: each learner's index among the learners on its host, round
robin over that host's GPUs (fake GPU counts here: the placement is a pure function)."""

from __future__ import annotations

import pytest

from hpcmarl.comm.placement import choose_device, host_slots, learner_device, learner_devices
from hpcmarl.errors import ConfigError


def test_two_learners_on_a_two_gpu_host_use_both_gpus() -> None:
    hosts = ["hpc1"] * 4 + ["hpc2"] * 4
    devices = learner_devices(hosts, [2, 3, 6, 7], {"hpc1": 2, "hpc2": 2})
    assert devices == {2: "cuda:0", 3: "cuda:1", 6: "cuda:0", 7: "cuda:1"}


def test_learners_beyond_a_hosts_gpus_share_them_and_gpuless_hosts_use_the_cpu() -> None:
    hosts = ["gpu1"] * 4 + ["cpu1"] * 4
    devices = learner_devices(hosts, [0, 1, 2, 3, 4, 5], {"gpu1": 2, "cpu1": 0})
    assert devices == {
        0: "cuda:0",
        1: "cuda:1",
        2: "cuda:0",
        3: "cuda:1",
        4: "cpu",
        5: "cpu",
    }


def test_slots_follow_hosts_not_launcher_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch step's SLURM_LOCALID=0, inherited by every rank mpirun starts, changes
    nothing: learners mapped round robin over 2 hosts of 4 GPUs each take cuda:0 and cuda:1."""
    monkeypatch.setenv("SLURM_LOCALID", "0")
    hosts = ["n1", "n2"] * 8
    devices = learner_devices(hosts, [4, 5, 6, 7], {"n1": 4, "n2": 4})
    assert devices == {4: "cuda:0", 5: "cuda:0", 6: "cuda:1", 7: "cuda:1"}
    assert host_slots(hosts, [7, 5, 6, 4]) == {4: 0, 5: 0, 6: 1, 7: 1}


def test_no_gpu_means_cpu() -> None:
    assert choose_device(0, 0) == "cpu"
    assert choose_device(5, 0) == "cpu"


def test_learners_go_round_robin_over_gpus() -> None:
    assert [choose_device(r, 4) for r in range(6)] == [
        "cuda:0",
        "cuda:1",
        "cuda:2",
        "cuda:3",
        "cuda:0",
        "cuda:1",
    ]
    assert choose_device(3, 1) == "cuda:0"


def test_learner_device_matches_this_machine() -> None:
    import torch

    device = learner_device("auto", 1)
    if torch.cuda.is_available():
        assert device == f"cuda:{1 % torch.cuda.device_count()}"
    else:
        assert device == "cpu"
    assert learner_device("cpu", 1) == "cpu"


def test_cuda_asked_for_on_a_node_without_one_is_refused_with_the_fix() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this node has a GPU: learner.device=cuda is granted here")
    with pytest.raises(ConfigError, match="learner.device is cuda, but.*fix: set learner.device"):
        learner_device("cuda")
