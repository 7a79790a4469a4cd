"""Environments behind one multi-agent vector interface (gymnasium is the one-agent case)."""

from hpcmarl.envs.adapters import SINGLE_AGENT_ID
from hpcmarl.envs.registry import ENV_KINDS, make_env_copy
from hpcmarl.envs.vector import MultiAgentVectorEnv, VectorStep, make_vector_env

__all__ = [
    "ENV_KINDS",
    "SINGLE_AGENT_ID",
    "MultiAgentVectorEnv",
    "VectorStep",
    "make_env_copy",
    "make_vector_env",
]
