"""Offline analysis of replay files: what a run collected, read without the training runtime.

Reads the replay logs collectors write (`RUN_DIR/replay/<collector>.h5`) and the replay tables
of checkpoints (`RUN_DIR/checkpoints/<id>/replay<N>.h5`) in bounded chunks, and exports an
agent's transitions in the Minari or D4RL layout. It needs h5py and numpy (and matplotlib,
the analysis extra, for plots) and imports neither MPI, torch nor the roles, so it runs on a
laptop next to a copied file: `python -m hpcmarl analyze RUN_DIR` or `python -m hpcmarl export
FILE --format minari`.
"""

from .episodes import EpisodeRecords
from .reader import Source, open_sources, replay_files
from .summary import Analysis, analyze

__all__ = ["Analysis", "EpisodeRecords", "Source", "analyze", "open_sources", "replay_files"]
