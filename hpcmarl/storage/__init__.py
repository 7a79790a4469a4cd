"""Storage: role state as HDF5 trees, and coordinated checkpoint directories built from them.

`hdf5` writes and reads one file atomically and safely; `checkpoint` groups one file per role
under a manifest and a `latest` pointer. Neither imports MPI: the commander and the roles call
them from whichever rank they run on.
"""

from .checkpoint import (
    Checkpoint,
    checkpoint_path,
    commit_checkpoint,
    has_checkpoints,
    latest_checkpoint,
    next_checkpoint_id,
    role_file,
    write_role_state,
)
from .hdf5 import (
    SCHEMA_VERSION,
    FileRecord,
    StorageError,
    Tree,
    read_tree,
    read_tree_with_attrs,
    sha256_of,
    write_tree_atomic,
)

__all__ = [
    "SCHEMA_VERSION",
    "Checkpoint",
    "FileRecord",
    "StorageError",
    "Tree",
    "checkpoint_path",
    "commit_checkpoint",
    "has_checkpoints",
    "latest_checkpoint",
    "next_checkpoint_id",
    "read_tree",
    "read_tree_with_attrs",
    "role_file",
    "sha256_of",
    "write_role_state",
    "write_tree_atomic",
]
