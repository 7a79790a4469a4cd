"""A collector's env steps/s vs a bare loop of the same environment and policy, in one process.

The collector is the real role, fed real credits by a real replay shard and weights by a real
parameter server, all on one in-process transport; only the time spent inside the collector's
`poll()` counts (in a job the shard runs on another rank). The bare loop is `act` + `env.step`
on the same vector env with the same actor. Cases: DQN's epsilon-greedy transitions on CartPole
and simple_spread, and MAPPO's sampled fragments (with the global state) on simple_spread.
Prints a table and, last, one JSON line.

    .venv/bin/python tools/bench_collector.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from hpcmarl.algos.actors import build_actor
from hpcmarl.config.schema import JobConfig
from hpcmarl.envs import make_vector_env
from hpcmarl.launch.build import build_collector, build_population, item_specs, probe_env
from hpcmarl.population import Population
from hpcmarl.roles.param_server import ParameterServer
from hpcmarl.roles.replay_shard import ReplayShard
from hpcmarl.testing.world import OneRank

SPREAD = ("pettingzoo", "mpe2.simple_spread_v3", {"max_cycles": 25, "continuous_actions": False})
CASES = {
    "cartpole_x1": ("dqn", "gymnasium", "CartPole-v1", {}, 1),
    "cartpole_x8": ("dqn", "gymnasium", "CartPole-v1", {}, 8),
    "spread_x1": ("dqn", *SPREAD, 1),
    "spread_mappo_x8": ("mappo", *SPREAD, 8),
}
EPSILON = 0.1


def job_for(algo: str, kind: str, env_id: str, kwargs: dict, num_envs: int) -> JobConfig:
    cfg = JobConfig()
    cfg.env.kind, cfg.env.id, cfg.env.kwargs, cfg.env.num_envs = kind, env_id, kwargs, num_envs
    cfg.learner.algo = algo
    cfg.learner.dqn.eps_start = cfg.learner.dqn.eps_end = EPSILON
    if algo == "mappo":
        cfg.learner.hidden_sizes = [64, 64]
        cfg.collector.fragment_length = 25
    cfg.replay.samples_per_insert = 0.0
    cfg.replay.prioritized = False
    cfg.replay.table_capacity = 4096
    cfg.topology.replay_shards = cfg.topology.learners = cfg.topology.collectors = 1
    return cfg


def weights_for(population: Population) -> dict[str, np.ndarray]:
    """Small random weights, the same for the collector and the bare loop."""
    rng = np.random.default_rng(0)
    return {
        key: (0.1 * rng.standard_normal(population.spec(key).size)).astype(np.float32)
        for key in population.keys()
    }


def collector_rate(cfg: JobConfig, seconds: float) -> float:
    """Env steps per second of collector time, the collector running one endless task."""
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
    bindings = spec.bindings(cfg.agents.strategy_spec_id)
    task = {"task_id": "b", "kind": "collect", "fragments": 10**9, "env_steps": 0}
    task["bindings"] = bindings
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
    """The same env and actor with nothing else: act, step, repeat (the shared policy's one
    forward pass over every agent per step, as the collector makes)."""
    env = make_vector_env(cfg.env, cfg.env.num_envs, 0)
    population = build_population(cfg, probe_env(cfg))
    (key,) = population.keys()
    actor = build_actor(population.spec(key))
    actor.set_weights(weights_for(population)[key])
    rng = np.random.default_rng(0)
    obs, steps = env.reset(), 0
    deadline = time.monotonic() + seconds
    start = time.perf_counter()
    while time.monotonic() < deadline:
        joined = np.concatenate([obs[a] for a in env.agents])
        acted = actor.act(joined, rng, env_steps=0, greedy=False).actions
        actions = dict(zip(env.agents, np.split(acted, len(env.agents)), strict=True))
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
    for name, case in CASES.items():
        cfg = job_for(*case)
        bare = bare_rate(cfg, args.seconds)
        mine = collector_rate(cfg, args.seconds)
        figures[f"{name}_bare_steps_per_s"] = round(bare, 1)
        figures[f"{name}_collector_steps_per_s"] = round(mine, 1)
        figures[f"{name}_ratio"] = round(mine / bare, 3)
        print(f"{name:<14} {bare:13,.0f} {mine:10,.0f} {mine / bare:6.3f}")
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
