"""A collector's env steps/s vs a bare loop of the same environment and policy, in one process.

The collector is the real role, fed real credits by a real replay shard and weights by a real
parameter server, all on one in-process transport; only the time spent inside the collector's
`poll()` counts (in a job the shard runs on another rank). The bare loop is `act` + `env.step`
on the same vector env with the same actor. Prints a table and, last, one JSON line.

    .venv/bin/python tools/bench_collector.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from hpcmarl.algos.dqn import QActor
from hpcmarl.comm.transport import LocalTransport
from hpcmarl.config.schema import JobConfig
from hpcmarl.core import policy_key
from hpcmarl.envs import make_vector_env
from hpcmarl.launch.build import build_collector, probe_env
from hpcmarl.launch.topology import build_topology
from hpcmarl.roles.param_server import ParameterServer
from hpcmarl.roles.replay_shard import ReplayShard

CASES = {
    "cartpole_x1": ("gymnasium", "CartPole-v1", {}, 1),
    "cartpole_x8": ("gymnasium", "CartPole-v1", {}, 8),
    "spread_x1": ("pettingzoo", "mpe2.simple_spread_v3", {"max_cycles": 25}, 1),
}
EPSILON = 0.1


def job_for(kind: str, env_id: str, kwargs: dict, num_envs: int) -> JobConfig:
    cfg = JobConfig()
    cfg.env.kind, cfg.env.id, cfg.env.kwargs, cfg.env.num_envs = kind, env_id, kwargs, num_envs
    cfg.replay.samples_per_insert = 0.0
    cfg.replay.prioritized = False
    cfg.topology.replay_shards = cfg.topology.learners = cfg.topology.collectors = 1
    return cfg


def collector_rate(cfg: JobConfig, seconds: float) -> float:
    """Env steps per second of collector time, the collector running one endless task."""
    spec = probe_env(cfg)
    topology = build_topology(1, cfg.topology, spec.policies)
    transport = LocalTransport(topology.rank_of, 0)
    commander = transport.register("commander")
    keys = [policy_key(cfg.agents.strategy_spec_id, p) for p in spec.policies]
    server = ParameterServer("ps0", transport, keys)
    shard = ReplayShard("replay0", transport, cfg.replay, spec.policies, ["collector0"], 0)
    collector = build_collector(cfg, spec, topology, transport, "collector0")
    shard.start()
    task = {"task_id": "bench", "kind": "collect", "fragments": 10**9, "epsilon": EPSILON}
    transport.inboxes["collector0"].append(_message("task", "collector0", task))
    spent, deadline = 0.0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.perf_counter()
        collector.poll()
        spent += time.perf_counter() - start
        shard.poll()
        server.poll()
        commander.clear()
    return collector.env_steps / spent


def bare_rate(cfg: JobConfig, seconds: float) -> float:
    """The same env and actor with nothing else: act, step, repeat."""
    env = make_vector_env(cfg.env, cfg.env.num_envs, 0)
    actors = {
        a: QActor(env.obs_dim(a), env.n_actions(a), cfg.learner.hidden_sizes)
        for a in env.agents[:1]
    }
    actor = next(iter(actors.values()))
    rng = np.random.default_rng(0)
    obs, steps = env.reset(), 0
    deadline = time.monotonic() + seconds
    start = time.perf_counter()
    while time.monotonic() < deadline:
        joined = actor.act(np.concatenate([obs[a] for a in env.agents]), EPSILON, rng)
        actions = dict(zip(env.agents, np.split(joined, len(env.agents)), strict=True))
        obs = env.step(actions).observations
        steps += env.num_envs
    return steps / (time.perf_counter() - start)


def _message(kind: str, dst: str, meta: dict):
    from hpcmarl.comm.protocol import Message

    return Message(kind, "commander", dst, meta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    figures: dict[str, float] = {}
    print(f"{'case':<14} {'bare steps/s':>13} {'collector':>10} {'ratio':>6}")
    for name, (kind, env_id, kwargs, num_envs) in CASES.items():
        cfg = job_for(kind, env_id, kwargs, num_envs)
        bare = bare_rate(cfg, args.seconds)
        mine = collector_rate(cfg, args.seconds)
        figures[f"{name}_bare_steps_per_s"] = round(bare, 1)
        figures[f"{name}_collector_steps_per_s"] = round(mine, 1)
        figures[f"{name}_ratio"] = round(mine / bare, 3)
        print(f"{name:<14} {bare:13,.0f} {mine:10,.0f} {mine / bare:6.3f}")
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
