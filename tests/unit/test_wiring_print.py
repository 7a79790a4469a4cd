"""What rank 0 prints of the wiring at start (launch/run.py Plan.wiring_text): by default a line
per host, or per rank on one host; `runtime.print_wiring: full` the groups, routes and messages."""

from __future__ import annotations

import pytest

from hpcmarl.config.loader import load_job
from hpcmarl.errors import ConfigError
from hpcmarl.launch.build import probe_env
from hpcmarl.launch.run import Plan
from hpcmarl.launch.topology import build_topology

JOB = "jobs/spread_shared.yaml"


def plan_on(hosts: list[str], overrides: list[str]) -> Plan:
    cfg = load_job(JOB, overrides)
    spec = probe_env(cfg)
    known = hosts if any(hosts) else []
    topology = build_topology(len(hosts), cfg.topology, spec.training_groups(), known)
    return Plan(cfg, spec, topology, run_dir="")


def test_by_default_one_host_prints_a_line_per_rank_and_no_table() -> None:
    lines = plan_on([""] * 5, []).wiring_text().splitlines()
    assert lines[0] == (
        "hpcmarl: topology for 5 rank(s) (runtime.print_wiring=full adds the groups, routes "
        "and messages)"
    )
    assert [line.split(":")[0] for line in lines[1:]] == [f"  rank {r:>3}" for r in range(5)]
    assert lines[1] == "  rank   0: commander, ps0, replay0"


def test_by_default_one_known_host_prints_its_ranks_then_its_name() -> None:
    """A run resumed on one node of a cluster says which node (tests/multihost resumes there)."""
    lines = plan_on(["hpc2"] * 4, []).wiring_text().splitlines()
    assert [line.split(":")[0] for line in lines[1:5]] == [f"  rank {r:>3}" for r in range(4)]
    assert lines[5].startswith("  host hpc2: ranks 0-3 (commander, ")


def test_by_default_two_hosts_print_a_line_per_host() -> None:
    plan = plan_on(["hpc1"] * 4 + ["hpc2"] * 4, [])
    lines = plan.wiring_text().splitlines()
    assert lines[3:] == [f"  note: {note}" for note in plan.topology.notes], lines
    assert lines[1].startswith("  host hpc1: ranks 0-3 (commander, ")
    assert lines[2].startswith("  host hpc2: ranks 4-7 (")


def test_full_prints_groups_routes_and_the_message_table() -> None:
    plan = plan_on(["hpc1"] * 4 + ["hpc2"] * 4, ["runtime.print_wiring=full"])
    text = plan.wiring_text()
    assert text == plan.topology.format(plan.wiring.lines())
    assert "  rank   7: " in text and "  host hpc2: ranks 4-7 (" in text
    assert "  group shared (policies shared): trained by " in text
    assert "  routes:\n" in text and "    every role <-> commander (control messages)" in text
    assert "  messages:\n" in text
    assert len(text.splitlines()) > 20


def test_an_unknown_setting_is_refused_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match="print_wiring") as err:
        load_job(JOB, ["runtime.print_wiring=tree"])
    assert "full" in str(err.value)
