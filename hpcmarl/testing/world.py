"""A job's world of one rank, built as `python -m hpcmarl` builds it, for tests and tools that
drive roles' polls by hand: the env probed, the topology of one rank, the in-process transport,
the population; and the commander, whose construction needs all of them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..comm.transport import LocalTransport
from ..config.schema import JobConfig
from ..launch.build import EnvSpec, build_population, probe_env
from ..launch.topology import Topology, build_topology
from ..metrics import MetricsSink
from ..population import Population
from ..roles.commander import Commander


@dataclass
class OneRank:
    """Everything a role needs to be built in this process."""

    cfg: JobConfig
    spec: EnvSpec = field(init=False)
    topology: Topology = field(init=False)
    transport: LocalTransport = field(init=False)

    def __post_init__(self) -> None:
        self.spec = probe_env(self.cfg)
        self.topology = build_topology(1, self.cfg.topology, self.spec.training_groups())
        self.transport = LocalTransport(self.topology.rank_of, 0)

    def population(self) -> Population:
        return build_population(self.cfg, self.spec)

    def commander(self, run_dir: str | Path, population: Population | None = None) -> Commander:
        """The commander, writing its metrics under `run_dir` and its progress lines nowhere."""
        sink = MetricsSink(str(run_dir), open(os.devnull, "w"))  # noqa: SIM115 - the sink owns it
        bindings = self.spec.bindings(self.cfg.agents.strategy_spec_id)
        population = population or self.population()
        return Commander(self.transport, self.cfg, self.topology, sink, population, bindings)
