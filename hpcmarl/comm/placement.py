"""Which device a learner trains on: one GPU per learner on a node, round robin, else the CPU.

Learners on one node are told apart by their node-local rank, which every launcher exports under
its own name; `local_rank % device_count` spreads them over the node's GPUs and lets several
share one when there are more learners than GPUs. Collectors act on small batches and stay on
the CPU, where a forward pass costs less than a transfer to a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import ConfigError

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


def learner_device(preference: str = "auto", environ: Mapping[str, str] | None = None) -> str:
    """The device this process's learner trains on, given `learner.device`."""
    if preference == "cpu":
        return "cpu"
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if preference == "cuda" and count == 0:
        build = "a CPU build of torch" if torch.version.cuda is None else "no CUDA device visible"
        raise ConfigError(
            f"learner.device is cuda, but this node has {build} (torch {torch.__version__})",
            "set learner.device=auto or cpu, or run the learners on a node with a GPU and a "
            "CUDA build of torch",
        )
    return choose_device(local_rank(environ), count)


def make_cuda_deterministic() -> None:
    """Deterministic mode on a GPU: cuBLAS with a fixed workspace and torch's deterministic
    kernels only (an op that has none raises, naming itself), so that there too a resumed run
    equals an uninterrupted one. Must run before the first matrix product on the device."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def device_line(name: str, device: str) -> str:
    """The start-up line that says where a learner trains, or '' on the CPU (the default, where
    a line per learner would be noise)."""
    if not device.startswith("cuda"):
        return ""
    import torch

    return f"hpcmarl: {name} trains on {device} ({torch.cuda.get_device_name(device)})"
