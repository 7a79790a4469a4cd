"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

import hpcmarl

TINY = {
    "commander": {"stop_value": None, "max_env_steps": 400},
    "topology": {"collectors": 1},
    "replay": {"learning_starts": 64},
}
"""A whole job as a mapping (the keys of a job file): CartPole DQN for a few hundred steps."""


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> hpcmarl.Run:
    """One tiny run in this process (about 3 s), read by the API and export tests."""
    return hpcmarl.train(TINY, ["learner.batch_size=16"], run_dir=tmp_path_factory.mktemp("r"))
