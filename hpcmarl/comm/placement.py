"""Which device a learner trains on: one GPU per learner on a host, round robin, else the CPU.

A learner's GPU is its index among the learners on its host, by rank, modulo the host's GPU
count: two learners on a two-GPU host use both, and more learners than GPUs share them. The
host of each rank is gathered once at start (`launch.memory.gather_nodes`), so the index holds
under any launcher. A launcher's node-local rank counts every role's rank, and Slurm's
`SLURM_LOCALID` of the batch step is inherited by every rank that `mpirun` starts (all 0), which
put several learners on `cuda:0`. Collectors act on small batches and stay on the CPU, where a
forward pass costs less than a transfer to a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from ..errors import ConfigError


def host_slots(hosts: Sequence[str], ranks: Iterable[int]) -> dict[int, int]:
    """Each of `ranks`'s index among those of `ranks` on its host, by rank (`hosts[r]` is rank
    r's host name)."""
    seen: dict[str, int] = {}
    slots = {}
    for rank in sorted(ranks):
        slots[rank] = seen.get(hosts[rank], 0)
        seen[hosts[rank]] = slots[rank] + 1
    return slots


def learner_devices(
    hosts: Sequence[str], learner_ranks: Iterable[int], gpus_per_host: Mapping[str, int]
) -> dict[int, str]:
    """The device of each learner rank, given every host's GPU count: the whole placement as
    one pure function (each learner applies its own row of it through `learner_device`)."""
    slots = host_slots(hosts, learner_ranks)
    return {rank: choose_device(slot, gpus_per_host[hosts[rank]]) for rank, slot in slots.items()}


def choose_device(slot: int, cuda_devices: int) -> str:
    """`cuda:<slot % n>` when the host has n > 0 GPUs, else `cpu`."""
    if cuda_devices <= 0:
        return "cpu"
    return f"cuda:{slot % cuda_devices}"


def learner_device(preference: str = "auto", slot: int = 0) -> str:
    """The device this process's learner trains on, given `learner.device` and the learner's
    index among the learners on its host (`host_slots`)."""
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
    return choose_device(slot, count)


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
