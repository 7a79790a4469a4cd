"""hpcmarl: multi-agent reinforcement learning as an MPI batch job."""

__version__ = "0.1.0"
