"""What a PSRO job must be, refused at start-up in one message each.

PSRO here grows one population per player of a two-player game, trains each new policy as a
best response with an algorithm the catalog says can be its oracle (DQN, whose greedy policy
becomes the frozen strategy; PPO, whose action distribution does; a plugin that sets
`psro_oracle`), and scores the meta-strategy with OpenSpiel's exploitability, which needs the
game's tree.
"""

from __future__ import annotations

from typing import Any

from hpcmarl.algos.catalog import CATALOG, resolve_algorithm
from hpcmarl.errors import ConfigError, EnvError
from hpcmarl.extras import require


def oracles() -> list[str]:
    """The catalog's algorithms that declare they can be PSRO's best-response oracle
    (`AlgoDecl.psro_oracle`): feed-forward actors whose frozen play is the policy they learned
    (DQN's greedy one, PPO's distribution). R2D2, VDN and QMIX are not: their actors are
    recurrent, and a frozen recurrent member would need its state carried through the
    exploitability's tree walk. A plugin class joins them with `psro_oracle = True`."""
    return [name for name, decl in CATALOG.items() if decl.psro_oracle]


def check_psro_job(cfg: Any, groups: dict[str, list[str]], n_agents: int) -> None:
    """Refuse a PSRO job that this PSRO cannot run, naming the setting to change."""
    if not cfg.psro.enabled:
        return
    if cfg.offline.dataset or cfg.commander.deterministic:
        raise ConfigError(
            "psro.enabled trains new policies online, one iteration after another; the job "
            "also sets offline.dataset or commander.deterministic",
            "drop offline.dataset and commander.deterministic from a PSRO job",
        )
    decl = resolve_algorithm(cfg.learner.algo)
    if not decl.psro_oracle or decl.offline_only:
        raise ConfigError(
            f"learner.algo = {cfg.learner.algo} cannot be PSRO's best-response oracle (it "
            "does not declare psro_oracle)",
            f"set learner.algo to one of {oracles()}, or to your own algorithm whose class "
            "sets psro_oracle = True (a feed-forward actor that plays what it learned)",
        )
    if len(groups) != 2 or n_agents != 2:
        raise ConfigError(
            f"PSRO plays two-player games with one policy per player; this job has {n_agents} "
            f"agents in {len(groups)} training groups",
            "play a two-player game (env.kind: openspiel, env.id: kuhn_poker) with "
            "agents.mapping: independent",
        )
    if cfg.psro.exploitability or cfg.psro.meta_solver == "nash":
        check_scorable(cfg)


def check_scorable(cfg: Any) -> None:
    """Exploitability and the nash solver need a two-player zero-sum OpenSpiel game."""
    wants = "psro.exploitability" if cfg.psro.exploitability else "psro.meta_solver = nash"
    if cfg.env.kind != "openspiel":
        raise EnvError(
            f"{wants} needs an OpenSpiel game's tree; env.kind is {cfg.env.kind}",
            "play an OpenSpiel game (env.kind: openspiel), or set psro.exploitability: false "
            "and psro.meta_solver: prd",
        )
    if cfg.psro.meta_solver == "nash":  # scipy's linprog solves it mid-run: refused here
        require("scipy.optimize", "psro.meta_solver=nash", "set psro.meta_solver: prd")
    from hpcmarl.envs.openspiel import load_game

    game = load_game(cfg.env.id, dict(cfg.env.kwargs))  # the games extra, required there
    from hpcmarl.psro.exploitability import GameError, check_game

    try:
        check_game(game)
    except GameError as error:
        raise EnvError(
            f"{wants}: {error.cause}",
            "play a two-player zero-sum game, or set psro.exploitability: false and "
            "psro.meta_solver: prd",
        ) from None
