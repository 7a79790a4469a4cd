"""Policy-Space Response Oracles as a schedule: populations that grow by best responses.

One training group per player. Iteration 0 takes the groups' first policies as they start; each
later iteration k then runs four phases, and the schedule's state says which one it is in:

1. `retarget`: one new policy per player joins the population (`add_policies`: a new key
   `{strategy_spec_id}/{policy}-{k}`, announced to its parameter server), and every crew of
   learners switches its groups to the new keys with fresh networks (`train` in the task); a
   group's replay data of older iterations is dropped by generation on the shards.
2. `train`: each collect task trains one player: that player's agents explore with the new
   policy, every other player plays greedily a policy drawn from its meta-strategy for the whole
   task (fresh episodes, so no episode mixes opponents), and only the learning player's items
   ship. Learners train until `updates_per_iteration` updates per group and collectors until
   `steps_per_iteration` env steps, both. An on-policy oracle (PPO) instead trains each batch
   of fresh fragments once, as the on-policy schedule does, with a `FragmentLedger` of the
   iteration's new keys (each collect task fills its learning player's books); its players'
   collection follows from the updates
   (`updates_per_iteration` x the algorithm's `batch_fragments` fragments each).
3. `evaluate`: every payoff entry that wants episodes is one matchup task (greedy policies, the
   same deals for every entry, the final weight versions named).
4. `solve`: the meta-solver gives the new meta-strategy; a collector scores its exploitability
   with OpenSpiel; the iteration's row goes to the metrics.

A frozen member plays the policy it learned: a value-based oracle's greedy policy, a policy-
gradient oracle's action distribution (sampled in collect and matchup tasks, its probabilities
in the exploitability).

Every field below is in `state()`, so a checkpoint at any point resumes the same iteration.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..algos.catalog import on_policy_window, resolve_algorithm
from ..algos.contract import PolicySpec
from ..psro.meta_solvers import meta_solver
from ..psro.payoff import PayoffTable
from ..roles.task_space import new_task_id
from .base import Context, Grant, Schedule, Situation
from .ledger import FragmentLedger
from .on_policy import update_grants

MATCHUP_SEED_OFFSET = 7_777
"""Matchups all start from the job seed plus this: every entry sees the same deals."""


@dataclass(frozen=True)
class Player:
    """One player of the meta-game: a training group and the agents acting for it."""

    group: str
    policy_of: dict[str, str]
    """The player's agents (environment order) -> their policy ids (keys `{sid}/{policy}` at
    iteration 0, `{sid}/{policy}-{k}` for the best response of iteration k)."""

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(self.policy_of)

    @property
    def policies(self) -> list[str]:
        return sorted(set(self.policy_of.values()))

    def bindings(self, member: dict[str, str]) -> dict[str, str]:
        """agent -> key, for the agents of this player acting with `member` (policy -> key)."""
        return {agent: member[policy] for agent, policy in self.policy_of.items()}


class PSRO(Schedule):
    """The PSRO loop over the phases above."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.cfg = ctx.cfg.psro
        self.sid = ctx.cfg.agents.strategy_spec_id
        self.players = players_of(ctx)
        self.solver = meta_solver(self.cfg.meta_solver)
        self.on_policy = resolve_algorithm(ctx.cfg.learner.algo).on_policy
        """The oracle trains on fresh fragments once (PPO) rather than from a replay table."""
        self.ledger: FragmentLedger | None = None
        """On-policy: the books of this iteration's new keys' fragments, per group."""
        self.rng = np.random.default_rng(ctx.cfg.seed + 31_337)
        self.iteration = 0
        self.phase = "evaluate"
        """retarget, train, evaluate, score, or between (an iteration is complete)."""
        self.populations: list[list[dict[str, str]]] = [
            [{p: f"{self.sid}/{p}" for p in player.policies}] for player in self.players
        ]
        """Per player, per member: policy id -> key."""
        self.versions: dict[str, int] = {k: 1 for pop in self.populations for k in pop[0].values()}
        """Final weight version of every key (1: the first policies as the learners publish)."""
        self.payoffs = PayoffTable(len(self.players))
        for p in range(len(self.players)):
            self.payoffs.add_policy(p)
        self.meta: list[np.ndarray] = [np.ones(1) for _ in self.players]
        self.steps = [0] * len(self.players)
        """Env steps collected this iteration for each player's new policy."""
        self.total_steps = 0
        """Env steps collected for best responses over the whole run."""
        self.updates: dict[tuple[str, ...], int] = dict.fromkeys(ctx.crews, 0)
        """Updates granted this iteration to each crew."""
        self.retargeted: set[tuple[str, ...]] = set()
        self.running: dict[str, tuple[Any, ...]] = {}
        """Task id -> what it is for: ("collect", player), ("learn", crew), ("matchup", entry)
        or ("score",)."""
        self.turn = 0
        self.pending_policies: list[tuple[PolicySpec, str]] = []
        self.rows: list[tuple[str, dict[str, Any]]] = []
        self.said: list[str] = []
        self.exploitability: float | None = None
        self.started = time.monotonic()
        self.elapsed_before = 0.0

    # -- the seam ---------------------------------------------------------------------------
    def grants(self, s: Situation) -> list[Grant]:
        if self.phase == "between":
            self.begin_iteration()
        if self.phase == "retarget":
            return self.retarget_grants(s)
        if self.phase == "train":
            return self.train_grants(s)
        if self.phase == "evaluate":
            return self.matchup_grants(s)
        if self.phase == "score":
            return self.score_grants(s)
        return []

    def on_task_done(self, role: str, kind: str, report: dict[str, Any]) -> None:
        purpose = self.running.pop(report["task_id"], ("lost",))
        if purpose[0] == "collect":
            self.steps[purpose[1]] += int(report["collect"]["env_steps"])
            self.total_steps += int(report["collect"]["env_steps"])
            self.on_fragments(report["task_id"], report["collect"].get("items", {}))
        elif purpose[0] == "learn":
            self.on_learned(report)
            if role == purpose[1][0]:  # the crew's tasks end together: count them once
                self.uncount_unfinished(purpose[1], report)
        elif purpose[0] == "matchup":
            result = report["matchup"]
            self.payoffs.record_moments(purpose[1], result["n"], result["sums"], result["sq"])
        elif purpose[0] == "score":
            self.conclude_iteration(report["exploitability"])
        self.advance()

    def on_task_failed(self, role: str, report: dict[str, Any]) -> None:
        purpose = self.running.pop(report["task_id"], ("lost",))
        if purpose[0] == "collect":  # what it inserted before it failed is still trained on
            self.on_fragments(report["task_id"], report.get("items", {}))
        self.advance()

    def stop_reason(self) -> str | None:
        """Between iterations: the iteration limit or the exploitability target."""
        if self.phase != "between":
            return None
        limit = self.cfg.stop_exploitability
        if limit is not None and self.exploitability is not None and self.exploitability <= limit:
            return f"psro.stop_exploitability reached ({self.exploitability:.4f} <= {limit:g})"
        if self.cfg.iterations and self.iteration >= self.cfg.iterations:
            return f"psro.iterations reached ({self.iteration} iterations)"
        return None

    def progress(self) -> float | None:
        """Iterations done of `psro.iterations`, the one in hand counted by how much of its
        training is done (its matchups and scoring count as done)."""
        if not self.cfg.iterations:
            return None
        done: float = self.iteration if self.phase == "between" else self.iteration - 1
        if self.phase == "train":
            done += self.training_done()
        elif self.phase in ("evaluate", "score"):
            done += 1
        return min(max(done, 0) / self.cfg.iterations, 1.0)

    def training_done(self) -> float:
        """How much of the iteration's updates (off-policy, and of its env steps) is done."""
        parts = [min(self.updates.values(), default=0) / self.cfg.updates_per_iteration]
        if not self.on_policy:
            parts.append(sum(self.steps) / self.cfg.steps_per_iteration)
        return min(1.0, *parts)

    def additions(self) -> list[tuple[PolicySpec, str]]:
        added, self.pending_policies = self.pending_policies, []
        return added

    def records(self) -> list[tuple[str, dict[str, Any]]]:
        rows, self.rows = self.rows, []
        return rows

    def lines(self) -> list[str]:
        said, self.said = self.said, []
        return said

    # -- phase 1: new policies, learners retargeted -------------------------------------------
    def begin_iteration(self) -> None:
        """MALib's add_policies: one new key per policy of every player."""
        self.iteration += 1
        k = self.iteration
        for p, player in enumerate(self.players):
            keys = {policy: f"{self.sid}/{policy}-{k}" for policy in player.policies}
            self.populations[p].append(keys)
            self.payoffs.add_policy(p)
            for policy, key in keys.items():
                first = self.ctx.specs[f"{self.sid}/{policy}"]
                self.pending_policies.append((replace(first, key=key), player.group))
        self.steps = [0] * len(self.players)
        self.updates = dict.fromkeys(self.ctx.crews, 0)
        self.retargeted = set()
        self.ledger = self.new_ledger()
        self.phase = "retarget"

    def new_ledger(self) -> FragmentLedger | None:
        """On-policy: empty books for each player's new keys, at version 1 (fresh networks)."""
        if not self.on_policy or not self.iteration:
            return None
        batch, lag = on_policy_window(self.ctx.cfg.learner)
        books = {
            player.group: (
                batch,
                lag,
                tuple(sorted(self.populations[p][-1].values())),
            )
            for p, player in enumerate(self.players)
        }
        return FragmentLedger(books, self.ctx.shards, self.ctx.items_per_task)

    def retarget_grants(self, s: Situation) -> list[Grant]:
        """Every crew switches its groups to the new keys (fresh networks, published at once)."""
        grants = []
        for members, groups in self.ctx.crews.items():
            if members in self.retargeted or not set(members) <= s.waiting_learners:
                continue
            train = {g: self.target(g) for g in groups}
            grants += self.crew_grants("retarget", members, updates=0, train=train)
            self.retargeted.add(members)
        return grants

    def target(self, group: str) -> dict[str, Any]:
        p = self.player_index(group)
        return {"keys": self.populations[p][-1], "generation": self.iteration}

    def crew_grants(self, kind: str, members: tuple[str, ...], **task: Any) -> list[Grant]:
        task_id = new_task_id(kind)
        grants = []
        for learner in members:
            grants.append(Grant(learner, {"task_id": f"{task_id}/{learner}", **task}))
            self.running[f"{task_id}/{learner}"] = ("learn", members)
        return grants

    # -- phase 2: best responses --------------------------------------------------------------
    def train_grants(self, s: Situation) -> list[Grant]:
        """Collect tasks until the iteration's steps and updates are done; a crew's learner
        tasks as its players' data comes in (`paced_updates`)."""
        if self.on_policy:
            return self.on_policy_grants(s)
        grants = []
        if not (self.collected() and self.trained()):
            for collector in s.waiting_collectors[: s.collector_slots]:
                grants.append(Grant(collector, self.training_task(s)))
        quota = self.cfg.updates_per_iteration
        for members, groups in self.ctx.crews.items():
            n = min(self.ctx.cfg.learner.updates_per_task, quota - self.updates[members])
            if n <= 0 or not set(members) <= s.waiting_learners:
                continue
            if self.updates[members] + n > self.paced_updates(groups):
                continue
            self.updates[members] += n
            grants += self.crew_grants("learner", members, updates=n)
        return grants

    def paced_updates(self, groups: tuple[str, ...]) -> float:
        """The updates a crew may have been granted by now: its quota in proportion to the
        steps its players have collected of their share of `steps_per_iteration`. Unpaced, how
        much of the iteration's data, and how little of it explored at a high epsilon, a best
        response was trained on depended on how fast the learner ran against the collectors:
        on the machine, not on the job. None before its players' first data this iteration:
        their tables are empty, and would stay so through a checkpoint's quiesce (no new
        collect tasks), so a learner task waiting for samples there could never finish, and
        the checkpoint would wait for it until the time limit. Collection goes on until the
        quota is trained, so a crew always reaches it."""
        share = self.cfg.steps_per_iteration / len(self.players)
        collected = min(self.steps[self.player_index(g)] for g in groups)
        return 0.0 if not collected else self.cfg.updates_per_iteration * collected / share

    def on_policy_grants(self, s: Situation) -> list[Grant]:
        """Collect tasks for the players whose books want fragments and have room for them;
        a crew's update once the batch of every group it trains is complete, until its quota."""
        grants = []
        for collector in s.waiting_collectors[: s.collector_slots]:
            learning = self.next_collecting_player()
            if learning is None:
                break
            grants.append(Grant(collector, self.training_task(s, learning)))
        assert self.ledger is not None
        for members, groups in self.ctx.crews.items():
            if self.updates[members] >= self.cfg.updates_per_iteration:
                continue
            if not set(members) <= s.waiting_learners:
                continue
            if not all(self.ledger.ready(g) for g in groups):
                continue
            self.updates[members] += 1
            for grant in update_grants(self.ledger, members, groups):
                self.running[grant.task["task_id"]] = ("learn", members)
                grants.append(grant)
        return grants

    def next_collecting_player(self) -> int | None:
        """On-policy: the next player in turn whose new policy still needs fragments for its
        quota of updates and whose books let a task start now."""
        assert self.ledger is not None
        wanted = self.cfg.updates_per_iteration * on_policy_window(self.ctx.cfg.learner)[0]
        for _ in self.players:
            p = self.turn % len(self.players)
            self.turn += 1
            group = self.players[p].group
            if self.ledger.planned(group) < wanted and self.ledger.may_collect([group]):
                return p
        return None

    def training_task(self, s: Situation, learning: int | None = None) -> dict[str, Any]:
        """Train a player (the next in turn, unless named) against policies drawn from the
        others' meta-strategy."""
        if learning is None:
            learning = self.turn % len(self.players)
            self.turn += 1
        bindings: dict[str, str] = {}
        frozen: list[str] = []
        for p, player in enumerate(self.players):
            if p == learning:
                member = self.populations[p][-1]
            else:
                drawn = self.rng.choice(len(self.meta[p]), p=self.meta[p])
                member = self.populations[p][int(drawn)]
                frozen += sorted(member.values())
            bindings |= player.bindings(member)
        task_id = new_task_id("collector")
        self.running[task_id] = ("collect", learning)
        versions = {key: self.versions[key] for key in frozen}
        group = self.players[learning].group
        if self.ledger is not None:
            versions |= self.ledger.versions([group])
            self.ledger.on_granted(task_id, [group])
        return self.collect_task(
            task_id,
            s,
            env_steps=self.steps[learning],
            bindings=bindings,
            record=[group],
            greedy=self.greedy(frozen),
            fresh=True,
            generation=self.iteration,
            versions=versions,
        )

    def greedy(self, keys: list[str]) -> list[str]:
        """The frozen keys that play greedily: all of a value-based oracle's, none of a policy-
        gradient oracle's (its action distribution is what it learned)."""
        return [] if self.on_policy else keys

    def on_fragments(self, task_id: str, items: dict[str, Any]) -> None:
        """On-policy: the fragments a collect task had inserted, into its player's books."""
        if self.ledger is not None:
            self.ledger.on_collected(task_id, items)

    def collected(self) -> bool:
        """Off-policy: the iteration's steps; on-policy, the data follows from the updates."""
        return self.on_policy or sum(self.steps) >= self.cfg.steps_per_iteration

    def trained(self) -> bool:
        return all(n >= self.cfg.updates_per_iteration for n in self.updates.values())

    def on_learned(self, report: dict[str, Any]) -> None:
        """A learner's task report: the versions it published are the ones matchups must use."""
        for group, row in report["stats"]["groups"].items():
            for key in self.populations[self.player_index(group)][-1].values():
                self.versions[key] = max(self.versions.get(key, 0), int(row["version"]))
            if self.ledger is not None:
                self.ledger.on_trained(group, int(row["version"]))

    def uncount_unfinished(self, members: tuple[str, ...], report: dict[str, Any]) -> None:
        """A task wrapped up early (a checkpoint) applied fewer updates than granted: the
        iteration's quota counts the ones applied."""
        rows = report["stats"]["groups"].values()
        self.updates[members] -= min((int(row.get("unfinished", 0)) for row in rows), default=0)

    # -- phase 3: matchups --------------------------------------------------------------------
    def matchup_grants(self, s: Situation) -> list[Grant]:
        busy = {purpose[1] for purpose in self.running.values() if purpose[0] == "matchup"}
        todo = [e for e in self.payoffs.missing(self.cfg.eval_episodes) if e not in busy]
        grants = []
        for collector, entry in zip(s.waiting_collectors[: s.collector_slots], todo, strict=False):
            bindings: dict[str, str] = {}
            for p, i in enumerate(entry):
                bindings |= self.players[p].bindings(self.populations[p][i])
            task_id = new_task_id("matchup")
            task = {
                "task_id": task_id,
                "kind": "matchup",
                "episodes": self.cfg.eval_episodes,
                "bindings": bindings,
                "seed": self.ctx.cfg.seed + MATCHUP_SEED_OFFSET,
                "versions": {k: self.versions[k] for k in set(bindings.values())},
                "players": [list(p.agents) for p in self.players],
                "greedy": self.greedy(sorted(set(bindings.values()))),
            }
            self.running[task_id] = ("matchup", entry)
            grants.append(Grant(collector, task))
        return grants

    # -- phase 4: meta-strategy and its exploitability ---------------------------------------
    def solve(self) -> None:
        self.meta = [np.asarray(m, np.float64) for m in self.solver(list(self.payoffs.mean()))]
        if self.cfg.exploitability:
            self.phase = "score"
        else:
            self.conclude_iteration(None)

    def score_grants(self, s: Situation) -> list[Grant]:
        if self.running or not s.waiting_collectors or not s.collector_slots:
            return []
        task_id = new_task_id("exploitability")
        task = {
            "task_id": task_id,
            "kind": "exploitability",
            "bindings": {},
            "populations": [[single_key(m) for m in pop] for pop in self.populations],
            "meta": [m.tolist() for m in self.meta],
            "versions": dict(self.versions),
        }
        self.running[task_id] = ("score",)
        return [Grant(s.waiting_collectors[0], task)]

    def conclude_iteration(self, result: dict[str, float] | None) -> None:
        self.exploitability = None if result is None else float(result["exploitability"])
        sizes = [len(pop) for pop in self.populations]
        row: dict[str, Any] = {
            "iteration": self.iteration,
            "population": sizes,
            "time_s": round(self.elapsed(), 2),
            "env_steps": self.total_steps,
            # Unrounded: the exploitability was scored on exactly this mixture, and a user who
            # recomputes it (or checks that it sums to one) needs all of its digits.
            "meta_strategy": [m.tolist() for m in self.meta],
            "payoffs": self.payoffs.mean()[0].round(6).tolist(),
            "payoff_se": np.nan_to_num(self.payoffs.standard_error()[0]).round(6).tolist(),
        }
        if result is not None:
            row |= {"exploitability": result["exploitability"], "nash_conv": result["nash_conv"]}
        self.rows.append(("psro", row))
        figure = "" if result is None else f": exploitability {result['exploitability']:.4f}"
        strategy = " | ".join(" ".join(f"{w:.2f}" for w in m) for m in self.meta)
        self.said.append(
            f"hpcmarl: psro iteration {self.iteration}{figure} (population "
            f"{'x'.join(map(str, sizes))}, meta-strategy {strategy}, {row['time_s']:.1f} s)"
        )
        self.phase = "between"

    # -- moving between phases ----------------------------------------------------------------
    def advance(self) -> None:
        """Leave a phase once its work is done and none of its tasks runs."""
        if self.running:
            return
        if self.phase == "retarget" and self.retargeted == set(self.ctx.crews):
            self.phase = "train"
        if self.phase == "train" and self.collected() and self.trained():
            self.phase = "evaluate"
        if self.phase == "evaluate" and not self.payoffs.missing(self.cfg.eval_episodes):
            self.solve()

    def player_index(self, group: str) -> int:
        return next(p for p, player in enumerate(self.players) if player.group == group)

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    # -- checkpoint ---------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        plain = {
            "iteration": self.iteration,
            "phase": self.phase,
            "populations": self.populations,
            "versions": self.versions,
            "meta": [m.tolist() for m in self.meta],
            "steps": self.steps,
            "total_steps": self.total_steps,
            "updates": [[list(c), n] for c, n in self.updates.items()],
            "retargeted": [list(c) for c in self.retargeted],
            "turn": self.turn,
            "exploitability": self.exploitability,
            "elapsed_s": self.elapsed(),
            "rng": self.rng.bit_generator.state,
            "ledger": None if self.ledger is None else self.ledger.state(),
        }
        return {"psro": json.dumps(plain), "payoffs": self.payoffs.state_dict()}

    def load_state(self, tree: dict[str, Any]) -> None:
        plain = json.loads(tree["psro"])
        self.iteration, self.phase = int(plain["iteration"]), plain["phase"]
        self.populations = plain["populations"]
        self.versions = {k: int(v) for k, v in plain["versions"].items()}
        self.meta = [np.asarray(m, np.float64) for m in plain["meta"]]
        self.steps = [int(n) for n in plain["steps"]]
        self.total_steps = int(plain["total_steps"])
        self.updates = {tuple(c): int(n) for c, n in plain["updates"]}
        self.retargeted = {tuple(c) for c in plain["retargeted"]}
        self.turn = int(plain["turn"])
        self.exploitability = plain["exploitability"]
        self.elapsed_before, self.started = float(plain["elapsed_s"]), time.monotonic()
        self.rng.bit_generator.state = plain["rng"]
        self.payoffs = PayoffTable.from_state(tree["payoffs"])
        self.ledger = self.new_ledger()
        if self.ledger is not None and plain.get("ledger"):
            self.ledger.load_state(plain["ledger"])


def single_key(member: dict[str, str]) -> str:
    """The key of a one-policy member (exploitability scores one policy per player)."""
    (key,) = member.values()
    return key


def players_of(ctx: Context) -> list[Player]:
    """The groups as players, in the environment's agent order (`player_0` first)."""
    players = []
    for group, keys in ctx.keys.items():
        policy_of = {a: k.split("/", 1)[1] for a, k in ctx.bindings.items() if k in keys}
        players.append(Player(group, policy_of))
    players.sort(key=lambda p: list(ctx.bindings).index(p.agents[0]))
    return players
