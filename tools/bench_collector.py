"""A collector's env steps/s vs a bare loop of the same environment and policy, in one process.

The collector is the real role, fed real credits by a real replay shard and weights by a real
parameter server, all on one in-process transport; only the time spent inside the collector's
`poll()` counts (in a job the shard runs on another rank). The bare loop is `act` + `env.step`
on the same vector env with the same actor. Cases: DQN's epsilon-greedy transitions on CartPole
and simple_spread, and MAPPO's sampled fragments (with the global state) on simple_spread.

A shared machine has slow spells of seconds, long enough to move one measurement by 20 %, so
the bare loop and the collector (both built once per case) take turns in slices of 0.2 s, and
each of `--rounds` rounds divides the two's rates over its slices. The figure is the median
round's ratio; the spread (lowest and highest round) says how far to trust it.
Prints a table and, last, one JSON line.

`--env-check` measures instead what the check of every env step for NaN and inf costs: the
same collector with the check on and with it off (`MultiAgentVectorEnv.check_finite`), in turns as
above; `*_env_check_ratio` is the collector's rate with the check over its rate without
(issue 31's bound: at least 0.98). Two collectors differ by more than the check's cost from
round to round, so the check is also timed alone, on a buffer of its size:
`*_env_check_direct_ratio` is 1 minus its time per env step over the collector's.

    .venv/bin/python tools/bench_collector.py [--seconds 3] [--rounds 5] [--cases NAME ...]
        [--env-check]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from hpcmarl.algos.actors import build_actor
from hpcmarl.config.schema import JobConfig
from hpcmarl.envs import make_vector_env
from hpcmarl.envs.vector import MultiAgentVectorEnv
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
SLICE_S = 0.2
"""The bare loop and the collector take turns in slices this long."""
BARE_CHUNK = 4
"""Vector steps the bare loop takes between looks at the clock (a slice overruns by at most
this many, which its own timing counts)."""


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


class CollectorLoop:
    """The collector running one endless task; only the time inside its `poll()` counts."""

    def __init__(self, cfg: JobConfig) -> None:
        world = OneRank(cfg)
        spec, topology, self.transport = world.spec, world.topology, world.transport
        self.commander = self.transport.register("commander")
        population = world.population()
        self.server = ParameterServer("ps0", self.transport)
        for key, flat in weights_for(population).items():
            self.server.create_table(key, population.spec(key).to_json()).set_weights(flat)
        replay = {g: items.replay for g, items in item_specs(cfg, spec).items()}
        self.shard = ReplayShard("replay0", self.transport, cfg.replay, replay, ["collector0"], 0)
        self.collector = build_collector(cfg, spec, topology, self.transport, "collector0")
        self.shard.start()
        task = {"task_id": "b", "kind": "collect", "fragments": 10**9, "env_steps": 0}
        task["bindings"] = spec.bindings(cfg.agents.strategy_spec_id)
        self.transport.inboxes["collector0"].append(_message("task", "collector0", task))

    def run(self, seconds: float) -> tuple[int, float]:
        """(env steps, collector seconds) of `seconds` of the loop."""
        steps, spent, deadline = self.collector.env_steps, 0.0, time.monotonic() + seconds
        while time.monotonic() < deadline:
            start = time.perf_counter()
            self.collector.poll()
            spent += time.perf_counter() - start
            self.shard.poll()
            self.server.poll()
            self.commander.clear()
        return self.collector.env_steps - steps, spent


class BareLoop:
    """The same env and actor with nothing else: act, step, repeat (the shared policy's one
    forward pass over every agent per step, as the collector makes). Nothing it does not need:
    one agent's observations are the batch as they are, and each agent's actions a slice of
    the batch's (a concatenation of one array and `np.split` made 12 % of a CartPole step,
    so the limit this loop stands for was set that much too low)."""

    def __init__(self, cfg: JobConfig) -> None:
        self.env = make_vector_env(cfg.env, cfg.env.num_envs, 0)
        population = build_population(cfg, probe_env(cfg))
        (key,) = population.keys()
        self.actor = build_actor(population.spec(key))
        self.actor.set_weights(weights_for(population)[key])
        self.rng = np.random.default_rng(0)
        self.obs = self.env.reset()

    def run(self, seconds: float) -> tuple[int, float]:
        steps, deadline = 0, time.monotonic() + seconds
        start = time.perf_counter()
        while time.monotonic() < deadline:
            self.advance(BARE_CHUNK)
            steps += BARE_CHUNK * self.env.num_envs
        return steps, time.perf_counter() - start

    def advance(self, vector_steps: int) -> None:
        """`vector_steps` steps of the loop (`tools/count_collector.py` counts them)."""
        env, agents = self.env, self.env.agents
        one = len(agents) == 1
        for _ in range(vector_steps):
            obs = self.obs
            joined = obs[agents[0]] if one else np.concatenate([obs[a] for a in agents])
            acted = self.actor.act(joined, self.rng, env_steps=0, greedy=False).actions
            rows = len(acted) // len(agents)
            actions = {a: acted[i * rows : (i + 1) * rows] for i, a in enumerate(agents)}
            self.obs = env.step(actions).observations


def _message(kind: str, dst: str, meta: dict):
    from hpcmarl.comm.protocol import Message

    return Message(kind, "commander", dst, meta)


def check_seconds_per_env_step(env: MultiAgentVectorEnv, calls: int = 20_000) -> float:
    """What the finite check of one vector step costs, per env step, timed alone."""
    numbers = env.step_numbers()
    start = time.perf_counter()
    for _ in range(calls):
        env.all_finite(numbers)
    return (time.perf_counter() - start) / calls / env.num_envs


def measure(
    cfg: JobConfig, seconds: float, rounds: int, env_check: bool = False
) -> tuple[list[tuple[float, float]], float]:
    """(bare, collector) env steps/s of each round: `seconds` of each, in slices of `SLICE_S`
    taken in turn, so that a slow spell of the machine falls on both alike. With `env_check`,
    (collector without the finite check, collector with it) instead. Second: the check's
    seconds per env step, timed alone."""
    bare: BareLoop | CollectorLoop
    if env_check:
        bare, collector = CollectorLoop(cfg), CollectorLoop(cfg)
        bare.collector.env.check_finite = False
    else:
        bare, collector = BareLoop(cfg), CollectorLoop(cfg)
    bare.run(SLICE_S), collector.run(SLICE_S)  # warm-up: first weights, first resets
    pairs = []
    for _ in range(rounds):
        totals = np.zeros((2, 2))  # (bare, collector) x (steps, seconds)
        for _ in range(max(1, round(seconds / SLICE_S))):
            totals[0] += bare.run(SLICE_S)
            totals[1] += collector.run(SLICE_S)
        pairs.append((totals[0, 0] / totals[0, 1], totals[1, 0] / totals[1, 1]))
    return pairs, check_seconds_per_env_step(collector.collector.env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="bare + collector pairs per case")
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument(
        "--env-check", action="store_true", help="the collector with the env check against without"
    )
    args = parser.parse_args()
    baseline, label = ("unchecked", "_env_check") if args.env_check else ("bare", "")
    torch.set_num_threads(1)
    figures: dict[str, float] = {"rounds": args.rounds, "seconds": args.seconds}
    first = f"{baseline} steps/s"
    direct = f"{'check us':>9} {'direct':>7}" if args.env_check else ""
    print(f"{'case':<16} {first:>13} {'collector':>10} {'ratio':>6}  {'spread':>11} {direct}")
    for name in args.cases:
        pairs, check_s = measure(job_for(*CASES[name]), args.seconds, args.rounds, args.env_check)
        ratios = sorted(mine / bare for bare, mine in pairs)
        bare = statistics.median(b for b, _ in pairs)
        mine = statistics.median(m for _, m in pairs)
        ratio = statistics.median(ratios)
        figures[f"{name}_{baseline}_steps_per_s"] = round(bare, 1)
        figures[f"{name}_collector_steps_per_s"] = round(mine, 1)
        figures[f"{name}{label}_ratio"] = round(ratio, 3)
        figures[f"{name}{label}_ratio_lowest"] = round(ratios[0], 3)
        figures[f"{name}{label}_ratio_highest"] = round(ratios[-1], 3)
        spread = f"{ratios[0]:.2f}-{ratios[-1]:.2f}"
        if args.env_check:  # the check's share of the collector's time per env step
            direct_ratio = 1.0 - check_s * mine
            figures[f"{name}_env_check_us_per_env_step"] = round(check_s * 1e6, 3)
            figures[f"{name}_env_check_direct_ratio"] = round(direct_ratio, 4)
            direct = f"{check_s * 1e6:9.3f} {direct_ratio:7.4f}"
        print(f"{name:<16} {bare:13,.0f} {mine:10,.0f} {ratio:6.3f}  {spread:>11} {direct}")
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
