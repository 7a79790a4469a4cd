"""Digests of everything a job's collector sends, for a change that must not change it.

A change made for speed to the collector, its writers or its env must leave every batch and
task report as it was. For each job file this runs the job's collector in one process against
a real replay shard and parameter server (fixed weights, `bench_collector.weights_for`) through
five tasks (plain, one key greedy, fresh episodes from a seed, one group recorded, plain) and
hashes every `batch`, `task_done` and `task_failed` it sends: kind, meta, and each array's
name, dtype, shape and bytes. Run it before and after the change (`--out`, then `--against`).
Prints a table and, last, one JSON line (the digests).

    .venv/bin/python tools/hash_batches.py [JOB ...] [--out FILE] [--against FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcmarl.config.loader import load_job
from hpcmarl.launch.build import build_collector, item_specs
from hpcmarl.roles.param_server import ParameterServer
from hpcmarl.roles.replay_shard import ReplayShard
from hpcmarl.testing.world import OneRank

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_collector import _message, weights_for  # noqa: E402

MAX_POLLS = 200_000
"""Polls a task may take before the run counts as stuck."""


def digest(path: str) -> tuple[str, int, int]:
    """(sha256 of what the job's collector sends, batches, task reports)."""
    cfg = load_job(path)
    cfg.topology.replay_shards = cfg.topology.learners = cfg.topology.collectors = 1
    cfg.replay.samples_per_insert = 0.0
    world = OneRank(cfg)
    spec, topology, transport = world.spec, world.topology, world.transport
    commander = transport.register("commander")
    population = world.population()
    server = ParameterServer("ps0", transport)
    for key, flat in weights_for(population).items():
        server.create_table(key, population.spec(key).to_json()).set_weights(flat)
    replay = {g: items.replay for g, items in item_specs(cfg, spec).items()}
    shard = ReplayShard("replay0", transport, cfg.replay, replay, ["collector0"], 0)
    collector = build_collector(cfg, spec, topology, transport, "collector0")
    shard.start()
    hashed, sent = hashlib.sha256(), {"batch": 0, "reports": 0}
    send = collector.send

    def hashing_send(
        kind: str, dst: str, meta: dict | None = None, arrays: dict[str, Any] | None = None
    ) -> None:
        if kind in ("batch", "task_done", "task_failed"):
            hashed.update(kind.encode() + json.dumps(meta, sort_keys=True, default=str).encode())
            columns = arrays or {}
            for name in sorted(columns):
                array = np.ascontiguousarray(columns[name])
                hashed.update(f"{name}{array.dtype}{array.shape}".encode() + array.tobytes())
            sent["batch" if kind == "batch" else "reports"] += 1
        send(kind, dst, meta, arrays)

    collector.send = hashing_send  # type: ignore[method-assign]
    bindings = spec.bindings(cfg.agents.strategy_spec_id)
    keys, groups = sorted(set(bindings.values())), sorted(collector.writers)
    tasks: list[dict[str, Any]] = [
        {"fragments": 3},
        {"fragments": 2, "greedy": keys[:1]},
        {"fragments": 2, "fresh": True, "seed": 7},
        {"fragments": 2, "record": groups[:1]},
        {"fragments": 3},
    ]
    for n, extra in enumerate(tasks):
        task = {"task_id": f"t{n}", "kind": "collect", "env_steps": 100 * n, "bindings": bindings}
        transport.inboxes["collector0"].append(_message("task", "collector0", task | extra))
        for _ in range(MAX_POLLS):
            collector.poll()
            shard.poll()
            server.poll()
            if sent["reports"] > n:
                break
        else:
            raise SystemExit(f"hash_batches: {path}: task {n} did not end in {MAX_POLLS} polls")
        commander.clear()
    return hashed.hexdigest(), sent["batch"], sent["reports"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("jobs", nargs="*", help="job files (default: every jobs/*.yaml)")
    parser.add_argument("--out", help="write the digests here as JSON")
    parser.add_argument("--against", help="digests written before: exit 1 where any differs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    jobs = args.jobs or sorted(str(p) for p in Path("jobs").glob("*.yaml"))
    before = json.loads(Path(args.against).read_text()) if args.against else {}
    digests: dict[str, str] = {}
    print(f"{'job':<36} {'sha256':<16} {'batches':>7} {'reports':>7} {'same':>5}")
    for job in jobs:
        digests[job], batches, reports = digest(job)
        same = "" if job not in before else ("yes" if before[job] == digests[job] else "NO")
        print(f"{job:<36} {digests[job][:16]} {batches:7d} {reports:7d} {same:>5}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(digests, indent=1) + "\n")
    print(json.dumps(digests), flush=True)
    if any(before.get(job, digests[job]) != digests[job] for job in digests):
        sys.exit(1)


if __name__ == "__main__":
    main()
