"""Which device a learner trains on: one GPU per learner on a node, round robin, else the CPU.

Learners on one node are told apart by their node-local rank, which every launcher exports under
its own name; `local_rank % device_count` spreads them over the node's GPUs and lets several
share one when there are more learners than GPUs. Collectors act on small batches and stay on
the CPU, where a forward pass costs less than a transfer to a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

LOCAL_RANK_VARS = (
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "PMI_LOCAL_RANK",
)
"""Node-local rank as exported by Slurm's srun, Open MPI, MPICH/Intel MPI (Hydra) and PMI."""


def local_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank among the processes of its node; 0 when no launcher says."""
    env = os.environ if environ is None else environ
    for var in LOCAL_RANK_VARS:
        value = env.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def choose_device(local: int, cuda_devices: int) -> str:
    """`cuda:<local % n>` when the node has n > 0 GPUs, else `cpu`."""
    if cuda_devices <= 0:
        return "cpu"
    return f"cuda:{local % cuda_devices}"


def learner_device(environ: Mapping[str, str] | None = None) -> str:
    """The device this process's learner should train on."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return choose_device(local_rank(environ), count)
