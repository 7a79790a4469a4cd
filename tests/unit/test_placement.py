"""Device choice for learners: node-local rank from any launcher, round robin over GPUs."""

from __future__ import annotations

import pytest

from hpcmarl.comm.placement import choose_device, learner_device, local_rank
from hpcmarl.errors import ConfigError


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, 0),
        ({"SLURM_LOCALID": "3"}, 3),
        ({"OMPI_COMM_WORLD_LOCAL_RANK": "2"}, 2),
        ({"MPI_LOCALRANKID": "5"}, 5),
        ({"PMI_LOCAL_RANK": "1"}, 1),
        ({"SLURM_LOCALID": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, 4),
        ({"SLURM_LOCALID": "", "OMPI_COMM_WORLD_LOCAL_RANK": "7"}, 7),
        ({"OMPI_COMM_WORLD_LOCAL_RANK": "x"}, 0),
    ],
)
def test_local_rank_reads_the_launchers_variable(env: dict, expected: int) -> None:
    assert local_rank(env) == expected


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

    device = learner_device("auto", {"OMPI_COMM_WORLD_LOCAL_RANK": "1"})
    if torch.cuda.is_available():
        assert device == f"cuda:{1 % torch.cuda.device_count()}"
    else:
        assert device == "cpu"
    assert learner_device("cpu", {"OMPI_COMM_WORLD_LOCAL_RANK": "1"}) == "cpu"


def test_cuda_asked_for_on_a_node_without_one_is_refused_with_the_fix() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this node has a GPU: learner.device=cuda is granted here")
    with pytest.raises(ConfigError, match="learner.device is cuda, but.*fix: set learner.device"):
        learner_device("cuda")
