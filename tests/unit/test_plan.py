"""The resolved wiring (launch/plan.py) of every job file, at 1, 5 and 16 ranks and on two hosts
of 8 ranks: every route is a row of the message table between roles that exist, shards and
collectors agree on who feeds whom, and the printed routes are the routes the roles get."""

from __future__ import annotations

import functools
import glob
import re

import pytest

from hpcmarl.comm.protocol import KINDS
from hpcmarl.config.loader import load_job
from hpcmarl.config.schema import JobConfig
from hpcmarl.errors import ConfigError, TopologyError
from hpcmarl.launch.build import EnvSpec, check_storage_topology, probe_env
from hpcmarl.launch.plan import FAMILIES, Wiring, resolve_wiring
from hpcmarl.launch.topology import Topology, build_topology

JOBS = sorted(glob.glob("jobs/*.yaml"))
PLACEMENTS = {"1": [""], "5": [""] * 5, "16": [""] * 16, "2x8": ["hpc1"] * 8 + ["hpc2"] * 8}
MODES = {"as is": [], "deterministic": ["commander.deterministic=true"]}


@functools.cache
def job(path: str, mode: str) -> tuple[JobConfig, EnvSpec] | None:
    """The job and its env spec, probed once per file and mode; None where the job refuses
    the mode (PSRO and offline jobs are not deterministic)."""
    cfg = load_job(path, MODES[mode])
    try:
        return cfg, probe_env(cfg)
    except ConfigError:
        return None


def wiring_of(path: str, mode: str, hosts: list[str]) -> Wiring | None:
    """The job's wiring, or None where the job refuses the mode or that world (it names the
    fix then)."""
    if (probed := job(path, mode)) is None:
        return None
    cfg, spec = probed
    known = hosts if any(hosts) else []
    try:
        topology = build_topology(len(hosts), cfg.topology, spec.training_groups(), known)
        check_storage_topology(cfg, topology)
    except TopologyError:
        return None
    return resolve_wiring(cfg, topology)


def kinds_in(column: str) -> set[str] | None:
    """The role kinds a sender or receiver column names (None: any role)."""
    if column in ("every role", "stateful roles"):
        return None
    return set(column.split("|"))


def expand(text: str) -> list[str]:
    """`collector0-8 step 2, replay1` -> the role names (topology.name_spans, backwards)."""
    names = []
    for part in text.split(", "):
        m = re.fullmatch(r"([a-z_]+?)(\d+)(?:-(\d+))?(?: step (\d+))?", part)
        assert m, part
        prefix, first, last, step = m.groups()
        last_n = int(last) if last else int(first)
        names += [f"{prefix}{i}" for i in range(int(first), last_n + 1, int(step or 1))]
    return names


def printed_pairs(topology: Topology, wiring: Wiring) -> set[tuple[str, str, str]]:
    """(initiator, peer, arrow) from the route lines of the wiring printed at start."""
    text = topology.format(wiring.lines())
    routes = text.split("  routes:\n")[1].split("\n  messages:")[0].splitlines()
    pairs = set()
    for line in routes[:-1]:  # the last one: every role <-> commander
        m = re.fullmatch(r"    (.+?) (->|<-) (.+?) \(.*\)", line)
        assert m, line
        for left in expand(m[1]):
            pairs |= {(left, right, m[2]) for right in expand(m[3])}
    assert routes[-1] == "    every role <-> commander (control messages)"
    return pairs


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", JOBS)
def test_every_route_of_every_job_is_in_the_message_table(path: str, mode: str) -> None:
    for placement, hosts in PLACEMENTS.items():
        wiring = wiring_of(path, mode, hosts)
        if wiring is None:
            continue
        kind_of = wiring.topology.kind_of
        for sender, receiver, message in wiring.route_list():
            assert sender in kind_of and receiver in kind_of, (placement, sender, receiver)
            row = KINDS[message]
            for role, column in ((sender, row.sender), (receiver, row.receiver)):
                allowed = kinds_in(column)
                assert allowed is None or kind_of[role] in allowed, (placement, message, role)
        expected = {
            (name, peer, family.arrow)
            for family in FAMILIES
            for name, peers in wiring.peers(family).items()
            for peer in peers
        }
        assert printed_pairs(wiring.topology, wiring) == expected, placement


@pytest.mark.parametrize("path", JOBS)
def test_shards_and_collectors_agree_on_who_feeds_whom(path: str) -> None:
    probed = job(path, "as is")
    assert probed is not None
    for hosts in PLACEMENTS.values():
        wiring = wiring_of(path, "as is", hosts)
        if wiring is None:
            continue
        names = wiring.topology.names
        fed = {(c, s) for s in names("replay_shard") for c in wiring[s].collectors}
        feeds = {(c, s) for c in names("collector") for s in wiring[c].shards}
        assert fed == (set() if probed[0].offline.dataset else feeds)


def test_compact_tables_print_each_collector_feeding_its_home_shard_only() -> None:
    wiring = wiring_of("jobs/cartpole_novel_stacked.yaml", "as is", PLACEMENTS["16"])
    assert wiring is not None
    assert wiring.home_shards
    assert {c: wiring[c].shards for c in ("collector0", "collector1", "collector2")} == {
        "collector0": ("replay0",),
        "collector1": ("replay1",),
        "collector2": ("replay0",),
    }
    lines = wiring.lines()
    assert "collector0-8 step 2 -> replay0 (batches, home shard)" in lines
    assert "collector1-9 step 2 -> replay1 (batches, home shard)" in lines


def test_deterministic_learners_print_their_share_of_the_shards() -> None:
    wiring = wiring_of("jobs/default.yaml", "deterministic", PLACEMENTS["16"])
    assert wiring is not None
    assert [wiring[name].shards for name in ("learner0", "learner1")] == [
        ("replay0",),
        ("replay1",),
    ]
    assert wiring["learner0"].leads == ("shared",) and wiring["learner1"].leads == ()
    assert wiring["learner1"].servers == ()
    lines = wiring.lines()
    assert "learner0 <- replay0 (samples)" in lines and "learner1 <- replay1 (samples)" in lines
    assert "learner0 -> ps0 (weights)" in lines
