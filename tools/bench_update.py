"""What one learner update costs on the CPU and on a GPU, per algorithm: whether a job's learners
should train on the node's GPU (`learner.device`).

For each job, builds its real algorithm for its real training group (the env probed as
`python -m hpcmarl` probes it), fills a batch of its own item spec with random contents (the
arithmetic does not depend on the values), and times whole updates after warm-ups: one batch
of `learner.batch_size` items off-policy, of `learner.ppo.batch_fragments` fragments for PPO
(its K epochs x M minibatches included). The CPU runs one torch thread, as a rank does by
default. An update ends in `.item()` calls on its statistics, so a GPU's queue is drained
inside the timed span. Prints a table and, as its last line, one JSON object whose
`*_cuda_speedup_ratio` fields are CPU time / GPU time (above 1: the GPU is faster).

    python tools/bench_update.py [--jobs dqn64 qmix ...] [--updates 50] [--devices cpu cuda]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from hpcmarl.algos import registry
from hpcmarl.algos.catalog import on_policy_window
from hpcmarl.algos.contract import run_update
from hpcmarl.config.loader import load_job
from hpcmarl.launch.build import probe_env
from hpcmarl.testing.groups import random_items

JOBS: dict[str, str] = {
    "dqn64": "jobs/cartpole_fast.yaml",
    "dqn256": "jobs/cartpole_dqn.yaml",
    "mappo": "jobs/spread_mappo.yaml",
    "qmix": "jobs/spread_qmix.yaml",
    "r2d2": "jobs/cartpole_novel_r2d2.yaml",
}
"""Name -> job file: the repo's jobs as users run them."""


def seconds_per_update(job: str, device: str, updates: int) -> float:
    cfg = load_job(job)
    spec = probe_env(cfg)
    group = spec.group_spec(next(iter(spec.training_groups())), cfg.agents.strategy_spec_id)
    items = registry.item_spec(cfg, group)
    algo = registry.algorithm_class(cfg.learner.algo)(group, cfg, cfg.seed, device)
    on_policy = items.replay.on_policy
    count = on_policy_window(cfg.learner)[0] if on_policy else cfg.learner.batch_size
    n_actions = min(group.n_actions.values())
    batches = [random_items(items, count, n_actions, seed=i) for i in range(4)]
    for batch in batches:  # warm-ups: kernels compiled, caches and allocators filled
        run_update(algo, batch)
    start = time.perf_counter()
    for i in range(updates):
        run_update(algo, batches[i % len(batches)])
    return (time.perf_counter() - start) / updates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--updates", type=int, default=50)
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    devices = [d for d in args.devices if d != "cuda" or torch.cuda.is_available()]
    if devices != args.devices:
        print("bench_update: torch sees no CUDA device; timing the CPU only")
    figures: dict[str, float] = {}
    print(f"{'job':8} {'file':30} " + " ".join(f"{d + ' ms':>10}" for d in devices))
    for name in args.jobs:
        job = JOBS[name]
        row = {d: seconds_per_update(job, d, args.updates) for d in devices}
        for device, seconds in row.items():
            figures[f"{name}_{device}_ms"] = round(seconds * 1e3, 3)
        if "cpu" in row and "cuda" in row:
            figures[f"{name}_cuda_speedup_ratio"] = round(row["cpu"] / row["cuda"], 3)
        print(f"{name:8} {job:30} " + " ".join(f"{row[d] * 1e3:10.2f}" for d in devices))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
