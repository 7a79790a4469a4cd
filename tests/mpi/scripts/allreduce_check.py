"""The learner collectives of one backend against a single-process reference.

Usage: allreduce_check.py KIND[,KIND] EXPECTED_BACKEND [STORE_DIR], on 6 ranks. Rank 0 stands by, as
a commander would: it is in no learner group and must never start Horovod. Ranks 1-2 and 3-5 form
two independent groups (of 2 and 3 learners, the first and second KIND) and check, in order: the
broadcast of the root's weights, gradients averaged within 1e-6 of the mean computed in one process,
100 DQN updates on fixed per-rank batches ending bit-identical across the group (a one-process run
is no bitwise reference: Adam turns last-bit differences of the summation order into visible ones
within 100 steps), the drift report naming a perturbed learner, averages with one member late that
the others poll for instead of blocking, and the same three with real `Learner` roles (see
allreduce_learners.py). The torch backend meets in STORE_DIR, where a stale store of an earlier run
is left first, and its process group must be gone after `close`. Prints `<rank>: ok`.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from allreduce_learners import check_learners  # noqa: I001 - beside this script
from mpi4py import MPI

from hpcmarl.algos.dqn import DQN
from hpcmarl.comm.allreduce import SoloAverager, digest, drift_report, make_averager
from hpcmarl.config.schema import JobConfig
from hpcmarl.errors import ConfigError
from hpcmarl.testing.groups import group_of as solo_group

SEED = 11


def make_dqn(seed: int = SEED) -> DQN:
    return DQN(solo_group(4, 2), JobConfig(), seed)


def batch(rank: int, size: int = 64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1_000 + rank)
    return {
        "observations": rng.standard_normal((size, 4)).astype(np.float32),
        "actions": rng.integers(0, 2, size),
        "rewards": rng.standard_normal(size).astype(np.float32),
        "next_observations": rng.standard_normal((size, 4)).astype(np.float32),
        "terminations": rng.random(size) < 0.1,
        "truncations": np.zeros(size, dtype=bool),
        "agent_id": np.zeros(size, np.int16),
        "episode_id": np.zeros(size, np.int64),
        "step": np.arange(size, dtype=np.int32),
        "policy_version": np.ones(size, np.int64),
    }


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def check_broadcast(av: SoloAverager, rank: int) -> None:
    algo = make_dqn()
    root = algo.group_weights()
    if rank > 0:  # a member that started apart, e.g. from another checkpoint
        algo.load_group_weights(root + rank)
    algo.load_group_weights(av.broadcast(algo.group_weights()))
    assert np.array_equal(algo.group_weights(), root), "broadcast did not give the root's weights"


def check_gradients(av: SoloAverager, rank: int) -> None:
    grads = [make_dqn().compute_gradients(batch(r), None)[0] for r in range(av.size)]
    want = np.mean(np.stack(grads).astype(np.float64), axis=0)
    got = av.average(grads[rank].copy())
    assert relative_error(got, want) <= 1e-6, f"DQN gradient off by {relative_error(got, want)}"
    big = [np.random.default_rng(r).standard_normal(1_000_003).astype(np.float32) for r in range(3)]
    want = np.mean(np.stack(big[: av.size]).astype(np.float64), axis=0)
    got = av.average(big[rank].copy())
    assert relative_error(got, want) <= 1e-6, f"1M vector off by {relative_error(got, want)}"


def train(av: SoloAverager, rank: int, steps: int) -> DQN:
    algo = make_dqn()
    for _ in range(steps):
        algo.apply_gradients(av.average(algo.compute_gradients(batch(rank), None)[0]))
    return algo


def check_training(av: SoloAverager, rank: int, members: list[str]) -> None:
    algo = train(av, rank, 100)
    row = np.array([algo.steps, digest(algo.group_weights())])
    rows = av.gather(row)
    assert rows.shape == (av.size, 2), rows.shape
    assert drift_report(rows, members) is None, drift_report(rows, members)
    start = make_dqn().group_weights()
    assert relative_error(algo.group_weights(), start) > 1e-3, "100 updates changed nothing"
    bad = row.copy()
    if rank == av.size - 1:
        bad[1] ^= 1  # one weight bit flipped, as far as the digest can tell
    report = drift_report(av.gather(bad), members)
    assert report is not None and report.startswith(f"{members[-1]} differ from"), report


def check_late_member(av: SoloAverager, rank: int) -> None:
    """Each member in turn posts 0.5 s late; the others keep polling, then get the right mean."""
    for late in range(av.size):
        if rank == late:
            time.sleep(0.5)
        handle = av.start(np.full(1_000, float(rank), np.float32))
        polls, deadline = 0, time.monotonic() + 60
        while not av.ready(handle):
            polls += 1
            assert time.monotonic() < deadline, "an average never completed"
            time.sleep(0.001)
        mean = av.result(handle)
        assert np.allclose(mean, (av.size - 1) / 2), mean[:3]
        assert rank == late or polls > 10, f"rank {rank} polled {polls} times for late {late}"


def check_forced_horovod_refused(sub: MPI.Comm) -> None:
    try:
        make_averager("horovod", sub, "p")
    except ConfigError as err:
        assert "install_horovod.sh" in str(err), err
        return
    raise AssertionError("learner.allreduce=horovod without horovod was accepted")


def group_of(rank: int) -> int | None:
    """Rank 0 stands by; ranks 1-2 are a group of two learners, ranks 3-5 a group of three."""
    return None if rank == 0 else (0 if rank <= 2 else 1)


def stale_store(sub: MPI.Comm, group: int) -> str | None:
    """The group's store path in STORE_DIR, with an earlier run's store left there (rank 0 of
    the group); None without a STORE_DIR (the MPI and Horovod runs, which use no store: a stale
    one made in the working folder stayed there)."""
    if len(sys.argv) <= 3:
        return None
    path = os.path.join(sys.argv[3], f"p{group}.store")
    if sub.rank == 0:
        with open(path, "wb") as f:
            f.write(os.urandom(64))
    return path


def check_closed(av: SoloAverager) -> None:
    av.close()
    if av.backend == "torch":
        import torch.distributed as dist

        assert not dist.is_initialized(), "close left the torch process group running"


def main() -> None:
    kinds, expected = sys.argv[1].split(","), sys.argv[2]
    world = MPI.COMM_WORLD
    group = group_of(world.rank)
    sub = world.Split(MPI.UNDEFINED if group is None else group, world.rank)
    if group is None:
        world.Barrier()
        started = "horovod.torch" in sys.modules and sys.modules["horovod.torch"].is_initialized()
        assert not started, "horovod was started on a rank outside the learner groups"
        print(f"{world.rank}: ok (stood by)", flush=True)
        return
    kind = kinds[group % len(kinds)]
    av, line = make_averager(kind, sub, f"p{group}", store=stale_store(sub, group) or "")
    if sub.rank == 0:
        print(line, flush=True)
    assert av.backend == expected, f"{kind} chose {av.backend}, expected {expected}"
    members = [f"learner{i}" for i in range(sub.size)]
    check_broadcast(av, sub.rank)
    check_gradients(av, sub.rank)
    check_training(av, sub.rank, members)
    check_late_member(av, sub.rank)
    check_learners(av, members, batch(sub.rank))
    if expected == "mpi" and kind == "auto":
        check_forced_horovod_refused(sub)
    check_closed(av)
    world.Barrier()
    print(f"{world.rank}: ok backend={av.backend} learners={sub.size}", flush=True)


if __name__ == "__main__":
    main()
